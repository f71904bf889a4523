"""TimeLens2's rollout-dispersion sample weights (``difficulty_sampling: dispersion``): the weight formula, the
weighted epoch order, rollouts in the scores file and the recipe that reads them. Model-free."""
import json
from types import SimpleNamespace

import pytest
import torch

from grounding_rl.data.dataset import GroundingDataset, weighted_repeat_sampler
from grounding_rl.data.selection import dispersion_weights, read_scores, select_samples
from grounding_rl.errors import UserError
from grounding_rl.update.config import GroundingGRPOConfig

torch.set_num_threads(1)


def test_dispersion_weights_are_timelens2s_formula():
    """(std + 1e-8)^p_std · (1 − mean + 1e-8)^p_mean, normalised (MCG-NJU/TimeLens2 rewards/sampling.py)."""
    # the 8B recipe: p_std 0, p_mean 2; means 0, 0.5, 1 → 1, 0.25, 1e-16 → 0.8, 0.2, 8e-17
    got = dispersion_weights([[0.0, 0.0], [0.25, 0.75], [1.0, 1.0]], p_std=0.0, p_mean=2.0)
    assert got.tolist() == pytest.approx([0.8, 0.2, 8e-17], rel=1e-6)
    # its code's defaults: p_std 2, p_mean 0; population stds 0.5, 0, 0.2 → 0.25, 1e-16, 0.04 over 0.29
    got = dispersion_weights([[0.0, 1.0], [0.5, 0.5], [0.2, 0.6]], p_std=2.0, p_mean=0.0)
    assert got.tolist() == pytest.approx([0.25 / 0.29, 1e-16 / 0.29, 0.04 / 0.29], rel=1e-6)
    # fewer than 2 rollouts: std 0, mean 0 (its fallback) → as heavy as the hardest sample under p_mean 2
    got = dispersion_weights([[0.0, 0.0], [0.9], []], p_std=0.0, p_mean=2.0)
    assert got.tolist() == pytest.approx([1 / 3, 1 / 3, 1 / 3], rel=1e-6)
    # the mean may read other rewards than the std; means are clipped into [0, 1]
    got = dispersion_weights([[0.0, 1.0], [0.0, 1.0]], [[1.5, 1.5], [0.5, 0.5]], p_std=1.0, p_mean=1.0)
    assert got.tolist() == pytest.approx([1e-8 / 0.5, 1 - 1e-8 / 0.5], rel=1e-5)
    with pytest.raises(ValueError, match="shape"):
        dispersion_weights([[0.0, 1.0]], [[1.0]])


def test_weighted_sampler_orders_by_weight_once_per_epoch_and_resumes():
    data = list(range(6))
    weights = [0.9, 0.02, 0.02, 0.02, 0.02, 0.02]
    make = lambda: weighted_repeat_sampler(data, weights, mini_repeat_count=2, batch_size=2, repeat_count=1,  # noqa
                                           seed=3)
    first = list(make())
    assert len(first) == 12 and sorted(set(first)) == data and all(first.count(i) == 2 for i in data)
    assert first[:2] == [0, 0]  # the heavy sample leads (seeded)
    fresh = make()
    list(fresh)
    epoch1 = list(fresh)  # the generator moved on: another order
    resumed = make()
    resumed.set_epoch(1)
    assert list(resumed) == epoch1
    same = make()
    same.set_epoch(0)
    assert list(same) == first
    with pytest.raises(ValueError, match="6 samples"):
        weighted_repeat_sampler(data, weights[:5], 2, 2, 1, 0)


def test_scores_file_may_hold_rollouts_only(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"qid": "a", "difficulty": {"rollout_intervals": [[[1, 2]], [], [[0, 1], [3, 4.5]]]}})
                    + "\n")
    assert read_scores(path)["a"]["rollout_intervals"][2] == [[0, 1], [3, 4.5]]
    path.write_text(json.dumps({"qid": "a", "difficulty": {"rollout_intervals": [[1, 2]]}}) + "\n")
    with pytest.raises(UserError, match=r"d.jsonl:1: difficulty.rollout_intervals must be a list of interval sets"):
        read_scores(path)
    # dispersion keeps every sample (the weights order the epoch), scores or not
    assert select_samples([{"qid": "x"}, {"qid": "y"}], sampling="dispersion")[0] == [0, 1]


def test_dispersion_recipe_scores_the_rollouts_with_the_training_and_mean_rewards():
    """GT [0, 10] in a 20 s clip. A: both rollouts exact (set_iou 1, 1); B: [0, 5] and [10, 20] (0.5, 0);
    C: no rollouts. p_std 0, p_mean 2 on set_iou: weights ∝ 1e-16, 0.75², 1 → ≈ 0, 0.36, 0.64."""
    from grounding_rl.reward.rewards import get_reward_funcs
    from grounding_rl.update.recipes.difficulty import DifficultyArguments, DifficultySelection

    def sample(qid, rollouts):
        row = {"video": "v.mp4", "query": "q", "start": 0.0, "end": 10.0, "duration": 20.0, "qid": qid}
        return row if rollouts is None else {**row, "difficulty": {"rollout_intervals": rollouts}}

    dataset = GroundingDataset([sample("A", [[[0, 10]], [[0, 10]]]), sample("B", [[[0, 5]], [[10, 20]]]),
                                sample("C", None)])
    args = SimpleNamespace(**vars(DifficultyArguments()), seed=0, data_seed=None, prompt_template="default",
                           online_difficulty_range=None, generation_batch_size=4, num_iterations=1,
                           steps_per_generation=1)
    args.difficulty_sampling = "dispersion"
    assert DifficultySelection.problems(args, args) == []
    names = ["twass1", "set_iou", "parse_penalty", "format"]
    trainer = SimpleNamespace(reward_funcs=get_reward_funcs(names), reward_func_names=names,
                              reward_weights=torch.ones(4), num_generations=2)
    recipe = DifficultySelection(args)
    assert recipe.prepare_data(trainer, dataset) is dataset
    assert recipe.weights.tolist() == pytest.approx([1e-16 / 1.5625, 0.5625 / 1.5625, 1 / 1.5625], rel=1e-6)
    counts = recipe.counts
    assert counts["reweighted"] == 3 and counts["without_rollouts"] == 1 and counts["top_decile_weight"] == 0.64
    order = list(recipe.sampler(trainer, dataset))
    assert len(order) == 2 * 2 and order[0] == order[1]  # one generation batch of 2 clips, each G = 2 times
    args.difficulty_mean_reward = "no_such_reward"
    assert "difficulty_mean_reward" in DifficultySelection.problems(args, args)[0]
    with pytest.raises(ValueError, match="online_difficulty_range filters it: use one of them"):
        GroundingGRPOConfig.build(output_dir="unused", use_cpu=True, difficulty_sampling="dispersion",
                                  online_difficulty_range=[0.0, 0.7])
    args.difficulty_mean_reward, args.difficulty_sampling, args.difficulty_p_std = "set_iou", "none", 2.0
    assert DifficultySelection.problems(args, args) == [
        "difficulty_p_std, difficulty_p_mean and difficulty_mean_reward weigh samples only with difficulty_sampling: "
        "dispersion (it is 'none')"]


def test_prepare_reads_timelens2_rollout_files(tmp_path):
    """TimeLens2's rollout rows (grpo/data/rollouts/*.jsonl: flat, the prompt baked into ``query``, ``rollouts`` the
    K decoded answers) become canonical lines with the bare query, the row's template and the parsed rollouts."""
    from grounding_rl.cli import main as cli
    from grounding_rl.data.readers import rollout_intervals
    from grounding_rl.prompts.templates import TEMPLATES

    assert rollout_intervals("[[1.0, 4.5], [9.0, 12.0]]") == [[1.0, 4.5], [9.0, 12.0]]
    assert rollout_intervals("[1, 2]") == [[1.0, 2.0]] and rollout_intervals("[5, 4]") == []
    assert rollout_intervals("no idea") == [] and rollout_intervals("__import__('os')") == []
    assert rollout_intervals([[3, 2], [1, "x"], [0, 1]]) == [[0.0, 1.0]]
    rows = [{"video_path": "a.mp4", "duration": 30.0, "span": [[1.0, 4.0], [10.0, 12.0]],
             "query": TEMPLATES["timelens2"].replace("[EVENT]", "a dog jumps"),
             "rollouts": ["[[1.0, 4.5], [9.0, 12.0]]", "[[2, 3]]", "no idea"]},
            {"video_path": "b.mp4", "duration": 20.0, "span": [2.0, 5.0],
             "query": TEMPLATES["timelens_100k"].replace("[EVENT]", "a man sits"), "rollouts": ["[[0, 20]]"]},
            {"video_path": "b.mp4", "duration": 20.0, "query": "plain question", "span": [[3.0, 6.0]]}]
    source, out = tmp_path / "rollouts.jsonl", tmp_path / "train.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert cli(["prepare", "--format", "timelens2", "--annotations", str(source), "--out", str(out)]) == 0
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["query"], r.get("prompt_template")) for r in lines] == [
        ("a dog jumps", "timelens2"), ("a man sits", "timelens_100k"), ("plain question", None)]
    assert lines[0]["difficulty"] == {"rollout_intervals": [[[1.0, 4.5], [9.0, 12.0]], [[2.0, 3.0]], []]}
    assert "difficulty" not in lines[2]
    assert read_scores(out)["timelens2:b.mp4#0"] == {"rollout_intervals": [[[0.0, 20.0]]]}


def test_difficulty_command_records_k_sampled_rollouts(tiny_model_dir, videos_dir, tmp_path):
    """``grounding-rl difficulty --num-rollouts 2 --temperature 1.0``: two sampled passes (their own resumable
    folders, seeds 0 and 1), each scored line holding both interval sets and their rewards; the file then trains
    with ``difficulty_sampling: dispersion``."""
    from grounding_rl.cli import main as cli
    from grounding_rl.data.selection import read_scores

    data, out = videos_dir / "annotations.jsonl", tmp_path / "scored.jsonl"
    argv = ["difficulty", "--model", str(tiny_model_dir), "--data", str(data), "--out", str(out), "--limit", "3",
            "--fps", "1", "--max-pixels", str(28 * 28 * 16), "--min-pixels", str(28 * 28 * 4), "--max-new-tokens",
            "8", "--num-workers", "0", "--reward-funcs", "iou", "--num-rollouts", "2", "--temperature", "1.0"]
    assert cli(argv) == 0
    passes = [[json.loads(line) for line in (tmp_path / "scored.jsonl.eval" / f"rollout_{k}" / "predictions.jsonl")
               .read_text().splitlines()] for k in range(2)]
    assert [len(p) for p in passes] == [3, 3]
    metrics = json.loads((tmp_path / "scored.jsonl.eval" / "rollout_1" / "metrics.json").read_text())
    assert metrics["sampling"]["do_sample"] is True and metrics["sampling"]["temperature"] == 1.0
    scores = read_scores(out)
    assert len(scores) == 3
    for record0, record1 in zip(*passes):
        score = scores[str(record0["qid"])]
        assert len(score["rollout_intervals"]) == len(score["rollout_rewards"]) == 2
        assert score["rollout_ious"] == [record0["iou"], record1["iou"]]
        assert score["iou"] == pytest.approx((record0["iou"] + record1["iou"]) / 2)
    sidecar = json.loads((tmp_path / "scored.json").read_text())
    assert sidecar["decoding"] == {"num_rollouts": 2, "temperature": 1.0, "top_p": 1.0, "seeds": [0, 1],
                                   "seeding": "per query: query_seed(seed of the pass, qid)"}
    assert cli(argv) == 0  # resumed: both passes complete, nothing generated again
    assert cli(argv[:-2] + ["--temperature", "0"]) == 2  # one line on stderr, exit 2


def test_query_seed_depends_on_the_seed_and_the_query_only():
    """SHA-256 of "seed/qid", first 63 bits: ``int.from_bytes(sha256(b"0/3").digest()[:8], "big") >> 1``."""
    from grounding_rl.rollout.greedy import query_seed

    assert query_seed(0, "3") == 8529617569768667619
    assert query_seed(1, "3") == 486255829187756567 and query_seed(0, "4") == 1877213241506560759
    assert all(0 <= query_seed(s, q) < 2 ** 63 for s in (0, 7, 2 ** 32 - 1) for q in ("0", "x", "é"))


ROLLOUT_ARGS = ["--fps", "1", "--max-pixels", str(28 * 28 * 16), "--min-pixels", str(28 * 28 * 4),
                "--max-new-tokens", "8", "--num-workers", "0", "--batch-size", "4", "--reward-funcs", "iou",
                "--num-rollouts", "2", "--temperature", "1.0"]


def _rollouts(model, data, out, *extra) -> list[str]:
    return ["difficulty", "--model", str(model), "--data", str(data), "--out", str(out), *ROLLOUT_ARGS, *extra]


def _pass_bytes(out, k) -> bytes:
    return (out.parent / f"{out.name}.eval" / f"rollout_{k}" / "predictions.jsonl").read_bytes()


def test_sampled_rollouts_resume_bit_exact_and_follow_the_seed(tiny_model_dir, videos_dir, tmp_path, capsys):
    """``difficulty --num-rollouts 2 --temperature 1``: a run stopped after 4 queries (``--limit``), then killed while
    writing pass 1's third line, then resumed, writes the scored file and both passes' predictions byte for byte as
    an uninterrupted run (batches of 4, so the resumed batches hold other queries); the two passes differ, and
    another ``--seed`` gives other answers."""
    from grounding_rl.cli import main as cli

    data = videos_dir / "annotations.jsonl"
    once, resumed = tmp_path / "once.jsonl", tmp_path / "resumed.jsonl"
    assert cli(_rollouts(tiny_model_dir, data, once)) == 0
    assert cli(_rollouts(tiny_model_dir, data, resumed, "--limit", "4")) == 0
    pass1 = tmp_path / "resumed.jsonl.eval" / "rollout_1"
    lines = (pass1 / "predictions.jsonl").read_text().splitlines(keepends=True)
    assert len(lines) == 4
    (pass1 / "predictions.jsonl").write_text("".join(lines[:2]) + lines[2][:20])
    (pass1 / "metrics.json").unlink()
    capsys.readouterr()
    assert cli(_rollouts(tiny_model_dir, data, resumed)) == 0
    out = capsys.readouterr().out
    assert "4 already in" in out and "2 already in" in out and "each query from its own seed" in out
    assert resumed.read_bytes() == once.read_bytes()
    assert [_pass_bytes(resumed, k) for k in range(2)] == [_pass_bytes(once, k) for k in range(2)]
    answers = [[json.loads(line)["answer"] for line in _pass_bytes(once, k).decode().splitlines()] for k in range(2)]
    assert len(answers[0]) == 15 and sum(a != b for a, b in zip(*answers)) >= 10  # pass 1 is not pass 0 again
    other = tmp_path / "seed7.jsonl"
    assert cli(_rollouts(tiny_model_dir, data, other, "--seed", "7", "--limit", "5")) == 0
    seven = [json.loads(line)["answer"] for line in _pass_bytes(other, 0).decode().splitlines()]
    assert sum(a != b for a, b in zip(seven, answers[0])) >= 4


@pytest.mark.slow
def test_sampled_rollouts_on_two_processes_match_one(tiny_model_dir, videos_dir, tmp_path):
    """The same sampled pass under ``torchrun --nproc_per_node 2`` (each rank its shard of whole videos, the seeds
    per query) writes the scored file and the predictions of one process, byte for byte."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from grounding_rl.cli import main as cli
    from grounding_rl.paths import REPO_ROOT

    data = videos_dir / "annotations.jsonl"
    single, sharded = tmp_path / "single.jsonl", tmp_path / "sharded.jsonl"
    assert cli(_rollouts(tiny_model_dir, data, single)) == 0
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
               OMP_NUM_THREADS="1", PYTHONPATH=str(REPO_ROOT))
    cmd = [str(Path(sys.executable).parent / "torchrun"), "--standalone", "--nproc_per_node", "2", "-m",
           "grounding_rl.cli", *_rollouts(tiny_model_dir, data, sharded)]
    proc = subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "15 to run on 2 process(es)" in proc.stdout
    assert sharded.read_bytes() == single.read_bytes()
    assert [_pass_bytes(sharded, k) for k in range(2)] == [_pass_bytes(single, k) for k in range(2)]


def test_a_sampled_pass_made_with_one_seed_per_shard_is_not_resumed(tmp_path):
    """A sampled pass written before each query had its own seed (its ``eval_config.json`` has a temperature but no
    ``seeding``) cannot be continued exactly: refused in one line; another ``--seed`` is refused too."""
    from grounding_rl.eval.evaluate import _check_run

    (tmp_path / "predictions.jsonl").write_text(json.dumps({"qid": "0", "answer": "1 to 2"}) + "\n")
    run = {"temperature": 1.0, "seed": 0, "seeding": "per query"}
    (tmp_path / "eval_config.json").write_text(json.dumps({"temperature": 1.0}))
    with pytest.raises(UserError, match="made before each query had its own seed"):
        _check_run(tmp_path, run)
    (tmp_path / "eval_config.json").write_text(json.dumps(run))
    _check_run(tmp_path, run)
    with pytest.raises(UserError, match="seed: 0 → 7"):
        _check_run(tmp_path, {**run, "seed": 7})


def test_dispersion_weights_equal_timelens2s_with_unclamped_rollouts_and_annotated_windows():
    """TimeLens2's build_sample_weights on rollouts past the video's end and overlapping ground truth (its own code,
    tests/fixtures/timelens2_rewards_edges.json): the recipe scores them with the annotated windows (``raw_spans``)
    and the rollouts as written."""
    import json
    from pathlib import Path

    from grounding_rl.data.samples import validate_spans
    from grounding_rl.reward.rewards import get_reward_funcs
    from grounding_rl.update.recipes.difficulty import DifficultyArguments, DifficultySelection

    case = json.loads((Path(__file__).parent / "fixtures" / "timelens2_rewards_edges.json").read_text())["dispersion"]
    rows = []
    for k, anno in enumerate(case["annos"]):
        spans = [list(s) for s in validate_spans(tuple(map(tuple, anno["span"])), anno["duration"])]
        rows.append({"video": "v.mp4", "query": "q", "start": spans[0][0], "end": spans[-1][1],
                     "duration": anno["duration"], "qid": str(k), "spans": spans, "raw_spans": anno["span"],
                     "difficulty": {"rollout_intervals": anno["rollout_intervals"]}})
    args = SimpleNamespace(**vars(DifficultyArguments()), seed=0, data_seed=None, prompt_template="timelens2",
                           online_difficulty_range=None, generation_batch_size=4, num_iterations=1,
                           steps_per_generation=1)
    args.difficulty_sampling, args.difficulty_mean_reward = "dispersion", "set_iou"
    args.difficulty_p_std, args.difficulty_p_mean = case["std_power"], case["mean_power"]
    names = ["twass1", "set_iou"]  # TimeLens2's "twass1,tiou"
    trainer = SimpleNamespace(reward_funcs=get_reward_funcs(names), reward_func_names=names,
                              reward_weights=torch.ones(2), num_generations=2)
    recipe = DifficultySelection(args)
    recipe.prepare_data(trainer, GroundingDataset(rows))
    assert recipe.weights.tolist() == pytest.approx(case["weights"], rel=1e-6)
