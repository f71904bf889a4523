"""Difficulty-aware data: TimeLens's weights and subset draw, Time-R1's range filter (offline and online), the
filtered sampler, the scores file (``grounding-rl difficulty``) and the trainer's offline selection."""
import json
import math
from pathlib import Path

import pytest
import torch

from grounding_rl.data.dataset import GroundingDataset, filtered_repeat_sampler
from grounding_rl.data.selection import (TIMELENS_DURATION_EDGES, OnlineRangeFilter, duration_strata, in_range,
                                          range_filter, read_scores, select_samples, timelens_subset,
                                          timelens_weights)
from grounding_rl.errors import UserError

torch.set_num_threads(1)


# ----------------------------------------------------------------------------------------------------- pure math
def test_timelens_weights_are_the_gaussian_over_the_bin_density():
    """IoUs 0.07, 0.08 share bin 1 of 20 (count 2), 0.27 is alone in bin 5, 0.97 alone in bin 19; mean 0.07, std 0.2:
    Gaussians 1, e^-0.00125, e^-0.5, e^-10.125 (z = 0, 0.05, 1, 4.5)."""
    got = timelens_weights([0.07, 0.08, 0.27, 0.97], mean=0.07, std=0.2, num_bins=20)
    raw = [1.0 / (2 + 1e-6), 0.998750781 / (2 + 1e-6), 0.606530660 / (1 + 1e-6), 4.0065297e-5 / (1 + 1e-6)]
    assert got.tolist() == pytest.approx([r / sum(raw) for r in raw], rel=1e-7)
    assert got.sum() == pytest.approx(1.0)
    gauss = timelens_weights([0.07, 0.08, 0.27, 0.97], mean=0.07, std=0.2, num_bins=0)  # no density division
    total = 1.0 + 0.998750781 + 0.606530660 + 4.0065297e-5
    assert gauss.tolist() == pytest.approx([1.0 / total, 0.998750781 / total, 0.606530660 / total,
                                            4.0065297e-5 / total], rel=1e-7)
    # IoU 1.0 falls in the last bin with 0.96 (np.histogram's closed right edge); a flat Gaussian leaves the density
    assert timelens_weights([1.0, 0.96, 0.5], mean=0.5, std=1e6).tolist() == pytest.approx([0.25, 0.25, 0.5])
    with pytest.raises(ValueError, match="widen"):
        timelens_weights([0.9], mean=0.0, std=1e-3)


def test_duration_strata_are_timelens_ranges_first_match_wins():
    strata = duration_strata([10.0, 30.0, 31.0, 250.0, 240.0], TIMELENS_DURATION_EDGES)
    assert len(strata) == 9  # [0,30] … [210,240], [240, inf)
    assert strata[0] == [0, 1] and strata[1] == [2] and strata[7] == [4] and strata[8] == [3]
    assert duration_strata([5.0, 500.0], None) == [[0, 1]]


def test_timelens_subset_draws_without_replacement_by_weight():
    # one IoU near the Gaussian's centre, nine far away (weight e^-144.5 each): a draw of one takes it, every seed
    ious = [0.9] * 4 + [0.05] + [0.9] * 5
    for seed in range(5):
        assert timelens_subset(ious, [10.0] * 10, 1, std=0.05, num_bins=0, seed=seed) == [4]
    drawn = timelens_subset([0.1 * k for k in range(10)], [10.0] * 10, 6, seed=0)
    assert len(drawn) == len(set(drawn)) == 6 and drawn == sorted(drawn)
    assert drawn == timelens_subset([0.1 * k for k in range(10)], [10.0] * 10, 6, seed=0)  # a function of the seed
    assert timelens_subset([0.3] * 5, [10.0] * 5, 99) == [0, 1, 2, 3, 4]  # larger than the set: all of it
    # two strata, 4 in all: int(4 / 2) = 2 from each, as TimeLens's hybrid.py splits its target
    drawn = timelens_subset([0.1] * 10, [10.0] * 5 + [50.0] * 5, 4, duration_edges=[30.0], seed=0)
    assert sum(i < 5 for i in drawn) == 2 and sum(i >= 5 for i in drawn) == 2
    # a stratum smaller than its share keeps what it has: the subset is smaller than asked
    assert len(timelens_subset([0.1] * 6, [10.0] * 5 + [50.0], 6, duration_edges=[30.0])) == 3 + 1


def test_time_r1_range_is_open_below_closed_above():
    assert [in_range(x, 0.0, 0.7) for x in (0.0, 1e-9, 0.3, 0.7, 0.7000001, 1.0)] == [False, True, True, True, False,
                                                                                       False]
    assert range_filter([0.0, 0.5, 0.7, 0.71, 0.2]) == [1, 2, 4]


def test_select_samples_range_then_draw_with_counts():
    samples = [{"qid": str(i), "duration": 10.0, "start": 1.0, "end": 2.0,
                "difficulty": {"iou": iou, "timelens_iou": iou}}
               for i, iou in enumerate([0.0, 0.1, 0.2, 0.3, 0.8, 0.9, 0.05, 0.0])]
    kept, counts = select_samples(samples, score_range=(0.0, 0.7))
    assert kept == [1, 2, 3, 6]
    assert counts == {"samples": 8, "kept": 4, "range_dropped_low": 2, "range_dropped_high": 2,
                      "out_of_video_dropped": 0, "reweighted": 0, "drawn": 0}
    kept, counts = select_samples(samples, sampling="timelens", score_range=(0.0, 0.7), subset_size=2, seed=1)
    assert len(kept) == 2 and set(kept) <= {1, 2, 3, 6} and counts["reweighted"] == 4 and counts["drawn"] == 2
    assert select_samples(samples[:3])[0] == [0, 1, 2]  # nothing asked: everything, no score needed
    with pytest.raises(UserError, match="1 of 2 samples have no difficulty score.*grounding-rl difficulty"):
        select_samples([samples[1], {"qid": "x", "duration": 5.0}], score_range=(0.0, 0.7))
    with pytest.raises(UserError, match="keeps none"):
        select_samples(samples[4:6], score_range=(0.0, 0.7))
    with pytest.raises(UserError, match="1 samples have no difficulty.timelens_iou .*qid '9'.*rescore"):
        select_samples(samples[:2] + [{"qid": "9", "duration": 5.0, "difficulty": {"iou": 0.2}}], sampling="timelens")


def test_timelens_draw_reproduces_timelens_code():
    """``difficulty_sampling: timelens`` with its defaults draws what TimeLens's own code draws: 15 seeds on 300
    samples (durations 3–600 s, every answer shape its parser meets, 53 annotations ending past the video),
    numbers computed with TencentARC/TimeLens @5d90c06's functions (tests/fixtures/timelens_draw.json names them)."""
    from types import SimpleNamespace

    from grounding_rl.data.samples import Sample, validate
    from grounding_rl.reward.scorings.timelens import timelens_filter_iou
    from grounding_rl.update.recipes.difficulty import DifficultyArguments, DifficultySelection

    fixture = json.loads((Path(__file__).parent / "fixtures" / "timelens_draw.json").read_text())
    rows = fixture["samples"]
    # what grounding-rl difficulty writes: TimeLens's filter IoU of the raw answer against the raw annotation
    assert [timelens_filter_iou(r["answer"], (r["start"], r["end"]), r["duration"]) for r in rows] == [
        r["timelens_iou"] for r in rows]
    samples, _ = validate([Sample(video=f"{r['qid']}.mp4", query=r["query"], start=r["start"], end=r["end"],
                                  duration=r["duration"], qid=r["qid"], source="jsonl") for r in rows], training=True)
    by_qid = {r["qid"]: r for r in rows}
    dataset = GroundingDataset([{**s.to_dict(), "difficulty": {"iou": 0.0, "answer": by_qid[s.qid]["answer"],
                                                              "timelens_iou": by_qid[s.qid]["timelens_iou"]}}
                                for s in samples])
    equal = 0
    for draw in fixture["draws"]:
        args = SimpleNamespace(**vars(DifficultyArguments()), seed=draw["seed"])
        args.difficulty_sampling, args.difficulty_subset_size = "timelens", draw["target_size"]
        trainer = SimpleNamespace()
        recipe = DifficultySelection(args)
        kept = recipe.prepare_data(trainer, dataset)
        equal += [s["qid"] for s in kept.samples] == draw["kept_qids"]
    assert equal == 15
    out_of_video = sum(not 0 <= r["start"] <= r["end"] <= r["duration"] for r in rows)
    assert recipe.counts["out_of_video_dropped"] == out_of_video == 53
    assert recipe.counts["drawn"] == len(fixture["draws"][-1]["kept_qids"]) == 85


def test_read_scores_by_qid_or_line_number(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join([json.dumps({"qid": "a", "difficulty": {"iou": 0.25, "reward": 1.0}}),
                               json.dumps({"query": "no qid", "difficulty": {"iou": 1}}), "",
                               json.dumps({"qid": "c"})]) + "\n")
    assert read_scores(path) == {"a": {"iou": 0.25, "reward": 1.0}, "1": {"iou": 1}}
    path.write_text(json.dumps({"qid": "a", "difficulty": {"iou": 1.5}}) + "\n")
    with pytest.raises(UserError, match=r"d.jsonl:1: difficulty must be an object with an 'iou' in \[0, 1\]"):
        read_scores(path)


def test_online_filter_drops_by_the_epoch_mean_and_resumes_from_its_state():
    f = OnlineRangeFilter(5, 0.0, 0.7)
    f.observe([0, 0, 1, 1, 2, 2, 3], [0.5, 1.0, 0.0, 0.0, 0.9, 0.8, float("nan")])  # means 0.75, 0, 0.85; 3 unscored
    f.observe([4, 4], [0.2, 0.4])  # mean 0.3
    assert f.advance_to(0) is None and f.active == [0, 1, 2, 3, 4]
    saved = f.state_dict()
    counts = f.advance_to(1)
    assert counts == {"epoch": 1, "kept": 2, "dropped": 3, "dropped_low": 1, "dropped_high": 2, "unscored": 1}
    assert f.active == [3, 4] and f.counts == [0] * 5 and f.advance_to(1) is None
    g = OnlineRangeFilter(5, 0.0, 0.7)
    g.load_state_dict(json.loads(json.dumps(saved)))  # through a checkpoint file
    g.advance_to(1)
    assert g.state_dict() == f.state_dict()
    f.observe([3, 4], [0.9, 0.95])  # everything scored is out of range: the previous set stays
    assert f.advance_to(2)["kept"] == 2 and f.active == [3, 4]
    with pytest.raises(ValueError, match="for 5 samples"):
        OnlineRangeFilter(6).load_state_dict(saved)


def test_filtered_sampler_keeps_epoch_length_and_cycles_the_kept_samples():
    data = list(range(6))
    f = OnlineRangeFilter(6, 0.0, 0.7)

    def sampler(selection):
        return filtered_repeat_sampler(data, selection, mini_repeat_count=2, batch_size=2, repeat_count=1, seed=0)

    s = sampler(f)
    first = list(s)
    assert len(first) == len(s) == 12 and sorted(set(first)) == data and first[0] == first[1]  # G copies in a row
    f.observe(range(6), [0.5, 0.9, 0.0, 0.6, 0.8, 0.1])  # keeps 0, 3, 5
    logged = []
    s = filtered_repeat_sampler(data, f, 2, 2, 1, 0, on_advance=logged.append)
    s.set_epoch(1)
    second = list(s)
    assert len(second) == 12 and set(second) == {0, 3, 5} and logged[0]["kept"] == 3
    assert sorted(second[::2][:3]) == [0, 3, 5]  # the first pass holds every kept sample once
    again = OnlineRangeFilter(6, 0.0, 0.7)  # another rank, or a resumed run, with the same state: the same order
    again.load_state_dict(f.state_dict())
    twin = sampler(again)
    twin.set_epoch(1)
    assert list(twin) == second


# ----------------------------------------------------------------------------------------------- grounding-rl difficulty
def test_difficulty_command_scores_each_line_and_records_its_settings(tiny_model_dir, videos_dir, tmp_path, capsys):
    """The greedy eval of ``eval`` (same predictions file), then each of the first 5 lines gets its IoU and its reward
    2·iou + varied_reward(answer); the rest stay unscored; a rerun resumes from the work folder."""
    from conftest import varied_reward

    from grounding_rl.cli import main as cli

    data, out = videos_dir / "annotations.jsonl", tmp_path / "scored.jsonl"
    argv = ["difficulty", "--model", str(tiny_model_dir), "--data", str(data), "--out", str(out), "--limit", "5",
            "--fps", "1", "--max-pixels", str(28 * 28 * 16), "--min-pixels", str(28 * 28 * 4), "--max-new-tokens",
            "8", "--num-workers", "0", "--reward-funcs", "iou", "tests/conftest.py:varied_reward",
            "--reward-weights", "2", "1"]
    assert cli(argv) == 0
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    source = [json.loads(line) for line in data.read_text().splitlines() if line.strip()]
    assert len(lines) == len(source) == 15
    same = lambda row: {k: v for k, v in row.items() if k not in ("difficulty", "video")}  # noqa: E731
    assert all(same(row) == same(src) for row, src in zip(lines, source))
    # the videos are found from the scored file's folder
    assert all((out.parent / row["video"]).resolve() == (videos_dir / src["video"]).resolve()
               for row, src in zip(lines, source))
    predictions = {p["qid"]: p for p in map(json.loads, (tmp_path / "scored.jsonl.eval" / "predictions.jsonl")
                                            .read_text().splitlines())}
    scored = [row for row in lines if "difficulty" in row]
    assert len(scored) == 5
    for k, row in enumerate(scored):
        p = predictions[str(row.get("qid", k))]
        assert row["difficulty"]["iou"] == p["iou"]
        assert row["difficulty"]["reward"] == pytest.approx(2 * p["iou"] + varied_reward([p["answer"]])[0])
    sidecar = json.loads((tmp_path / "scored.json").read_text())
    assert sidecar["counts"] == {"lines": 15, "scored": 5, "unscored": 10}
    assert sidecar["reward_funcs"] == ["iou", "tests/conftest.py:varied_reward"] and sidecar["reward_weights"] == [2, 1]
    assert sidecar["decoding"] == "greedy" and sidecar["max_new_tokens"] == 8 and len(sidecar["data_sha256"]) == 64
    assert sidecar["model"] == str(tiny_model_dir.resolve()) and sidecar["video"]["fps"] == 1.0
    assert read_scores(out).keys() == {str(r.get("qid", k)) for k, r in enumerate(scored)}
    capsys.readouterr()
    assert cli(argv) == 0  # resumed: nothing left to generate
    assert "5 already in" in capsys.readouterr().out
    assert cli(["difficulty", "--model", str(tiny_model_dir), "--data", str(data), "--out", str(data)]) == 2


# ------------------------------------------------------------------------------------------ offline selection in GRPO
def test_trainer_trains_on_the_offline_selection(tiny_model_dir, videos_dir, tmp_path):
    from conftest import MAKEUP, OHOFG, POOL, varied_reward

    from grounding_rl.models.loading import load_policy, load_processor
    from grounding_rl.update.config import GroundingGRPOConfig
    from grounding_rl.update.trainer import GroundingGRPOTrainer

    samples = [{"video": str(videos_dir / name), "query": "q", "start": 1.0, "end": 4.0, "duration": 6.5,
                "qid": str(i), "difficulty": {"iou": iou, "timelens_iou": iou}}
               for i, (name, iou) in enumerate([(POOL, 0.0), (MAKEUP, 0.4), (OHOFG, 0.95), (POOL, 0.1)])]
    args = GroundingGRPOConfig.build(output_dir=str(tmp_path), use_cpu=True, per_device_train_batch_size=4,
                                     report_to=[], difficulty_range=[0.0, 0.7], difficulty_sampling="timelens",
                                     difficulty_subset_size=9)
    trainer = GroundingGRPOTrainer(load_policy(str(tiny_model_dir)), args, GroundingDataset(samples),
                                   load_processor(str(tiny_model_dir)), reward_funcs=[varied_reward])
    # the range keeps qids 1 and 3 (IoU 0.4, 0.1), both in the first of the 9 duration buckets, whose share is
    # int(9 / 9) = 1; TimeLens's Gaussian (0.05, 0.2) weighs 3 at 0.82: seed 42 draws it
    assert [s["qid"] for s in trainer.train_dataset.samples] == ["3"]
    assert trainer.recipes[0].counts == {"samples": 4, "kept": 1, "range_dropped_low": 1, "range_dropped_high": 1,
                                      "out_of_video_dropped": 0, "reweighted": 2, "drawn": 1}
    assert trainer.data_collator.dataset is trainer.train_dataset
    assert math.isclose(trainer.train_dataset.samples[0]["difficulty"]["iou"], 0.1)


def test_scored_file_written_elsewhere_still_finds_the_videos(tmp_path):
    """A relative video path is rewritten relative to the scored file's folder (an absolute one is kept)."""
    import json

    from grounding_rl.eval.difficulty_scores import write_scored

    data_dir, out_dir = tmp_path / "data", tmp_path / "runs" / "scored"
    data_dir.mkdir()
    rows = [{"video": "clips/a.mp4", "query": "q", "start": 1.0, "end": 2.0, "duration": 5.0, "qid": "a"},
            {"video": "/abs/b.mp4", "query": "q", "start": 1.0, "end": 2.0, "duration": 5.0, "qid": "b"}]
    (data_dir / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    counts = write_scored(data_dir / "train.jsonl", out_dir / "train_scored.jsonl", {"a": {"iou": 0.5}})
    written = [json.loads(line) for line in (out_dir / "train_scored.jsonl").read_text().splitlines()]
    assert [w["video"] for w in written] == ["../../data/clips/a.mp4", "/abs/b.mp4"]
    assert (out_dir / written[0]["video"]).resolve() == (data_dir / "clips" / "a.mp4").resolve()
    assert written[0]["difficulty"] == {"iou": 0.5} and "difficulty" not in written[1]
    assert counts == {"lines": 2, "scored": 1, "unscored": 1}
