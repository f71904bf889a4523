"""Resuming restores the run: killed at a checkpoint and resumed, ``train`` (GRPO) and ``sft`` end with the same
weights as an uninterrupted run, bit for bit on CPU with a fixed seed (two uninterrupted runs are bit-identical, so the
check is exact); two fresh LoRA runs with one seed are bit-identical; one run per output folder; a resume at the last
checkpoint trains nothing; a checkpoint whose keys do not match is an error; GRPO checkpoints are written only at
generation boundaries.
"""
import json
import os
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from conftest import MAKEUP, POOL, clip_dataset, grpo_config, make_grpo_trainer, varied_reward

from grounding_rl.models.loading import load_policy
from grounding_rl.update.resume import CheckpointLoadError, load_full_weights

torch.set_num_threads(1)


def grpo_args(out, **overrides):
    return grpo_config(out, **{"max_steps": 4, "logging_steps": 1, "save_strategy": "steps", "save_steps": 2,
                               "learning_rate": 1e-3, **overrides})


def dataset(videos_dir):
    return clip_dataset(videos_dir, (POOL, MAKEUP))


def grpo_trainer(out, model_dir, videos_dir, peft=False, **overrides):
    lora = None
    if peft:
        from peft import LoraConfig

        lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    return make_grpo_trainer(model_dir, grpo_args(out, **overrides), dataset(videos_dir), peft=lora)


def weights(trainer):
    return {k: v.detach().clone() for k, v in trainer.accelerator.unwrap_model(trainer.model).state_dict().items()}


def assert_identical(a, b):
    assert a.keys() == b.keys()
    differ = [k for k in a if not torch.equal(a[k], b[k])]
    assert differ == [], f"{len(differ)} tensors differ, e.g. {differ[:3]}"


@pytest.mark.parametrize("peft, at", [(False, 1), (False, 2), (True, 3)], ids=["full-mid-epoch", "full-epoch-end",
                                                                             "lora-mid-epoch"])
def test_grpo_resumed_at_a_checkpoint_ends_bit_identical(tmp_path, tiny_model_dir, videos_dir, peft, at):
    """2 clips × G 4 rows, 4 rows a step: an epoch is 2 steps, so checkpoint-1 and -3 are inside an epoch."""
    full = grpo_trainer(tmp_path / "full", tiny_model_dir, videos_dir, peft=peft, save_steps=1)
    start = weights(full)
    full.train()
    uninterrupted = weights(full)
    moved = max((uninterrupted[k].float() - start[k].float()).abs().max().item() for k in start)
    assert moved > 1e-5  # the run moves the weights, so losing steps would show

    resumed = grpo_trainer(tmp_path / "resumed", tiny_model_dir, videos_dir, peft=peft)
    resumed.train(resume_from_checkpoint=str(tmp_path / "full" / f"checkpoint-{at}"))
    assert resumed.state.global_step == 4
    assert_identical(weights(resumed), uninterrupted)
    logged = lambda t: {h["step"]: h for h in t.state.log_history if "loss" in h}  # noqa: E731
    assert sorted(logged(resumed)) == [1, 2, 3, 4]  # steps up to the checkpoint from its state, the rest trained again
    wall = ("runtime", "per_second", "step_time", "timing/")  # seconds measured, not computed
    same = lambda h: {k: v for k, v in h.items() if not any(w in k for w in wall)}  # noqa: E731
    for step in range(at + 1, 5):
        assert same(logged(resumed)[step]) == same(logged(full)[step])


def test_resume_at_the_last_checkpoint_trains_nothing(tmp_path, tiny_model_dir, videos_dir):
    full = grpo_trainer(tmp_path / "full", tiny_model_dir, videos_dir, max_steps=2)
    full.train()
    final = weights(full)
    again = grpo_trainer(tmp_path / "again", tiny_model_dir, videos_dir, max_steps=2)
    again.train(resume_from_checkpoint=str(tmp_path / "full" / "checkpoint-2"))
    assert again.state.global_step == 2
    assert [h["step"] for h in again.state.log_history if "loss" in h] == [1, 2]  # no step 3
    assert_identical(weights(again), final)


def test_a_checkpoint_with_a_missing_or_unexpected_key_is_an_error(tmp_path, tiny_model_dir):
    model = load_policy(str(tiny_model_dir))
    for name, edit in (("missing", lambda sd: sd.pop(next(k for k in sd if "layers.0.mlp" in k))),
                       ("unexpected", lambda sd: sd.__setitem__("model.layers.99.extra.weight", torch.zeros(2)))):
        folder = tmp_path / name
        shutil.copytree(tiny_model_dir, folder)
        state = load_file(str(folder / "model.safetensors"))
        edit(state)
        save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
        with pytest.raises(CheckpointLoadError, match=f"1 {name} keys"):
            load_full_weights(model, folder)
    load_full_weights(model, tiny_model_dir)  # the intact checkpoint loads


def test_grpo_checkpoints_only_at_generation_boundaries(tmp_path):
    with pytest.raises(ValueError, match="save_steps 1 is not a multiple of the generation window of 2"):
        grpo_args(tmp_path, steps_per_generation=2, save_steps=1)
    with pytest.raises(ValueError, match="generation window of 3"):
        grpo_args(tmp_path, num_iterations=3, save_steps=2)
    assert grpo_args(tmp_path, steps_per_generation=2, save_steps=4).generation_window == 2
    assert grpo_args(tmp_path, per_device_train_batch_size=4, gradient_accumulation_steps=2,
                     steps_per_generation=4, save_steps=2).generation_window == 2


def test_a_checkpoint_inside_a_generation_window_is_refused(tmp_path, tiny_model_dir, videos_dir):
    from grounding_rl.errors import UserError

    grpo_trainer(tmp_path / "a", tiny_model_dir, videos_dir, max_steps=1, save_steps=1).train()
    later = grpo_trainer(tmp_path / "b", tiny_model_dir, videos_dir, steps_per_generation=2, max_steps=4)
    with pytest.raises(UserError, match="step 1 is inside a generation window of 2"):
        later.train(resume_from_checkpoint=str(tmp_path / "a" / "checkpoint-1"))


@pytest.mark.parametrize("peft", [False, True], ids=["full", "lora"])
def test_sft_killed_and_resumed_ends_bit_identical(tmp_path, demo_dir, bpe_tiny_model_dir, peft):
    """``grounding-rl sft`` run to the end, and the same run "killed" after checkpoint-3 (only that checkpoint left in
    its folder) and resumed with ``--resume_from_checkpoint true``: the final weights are the same bytes."""
    from grounding_rl.cli.sft import main

    def run(out, *extra):
        argv = ["--config", "configs/demo_sft.yaml", "--model_name_or_path", str(bpe_tiny_model_dir),
                "--train_file", str(demo_dir / "train.jsonl"), "--output_dir", str(out), "--max_train_samples", "4",
                "--per_device_train_batch_size", "2", "--max_steps", "5", "--warmup_steps", "1",
                "--learning_rate", "3e-3", "--logging_steps", "1", "--save_strategy", "steps", "--save_steps", "1",
                "--disable_tqdm", "true", "--report_to", "none", *extra]
        if peft:
            argv += ["--use_peft", "--lora_r", "4", "--lora_alpha", "8"]  # the default targets (the LLM's projections)
        assert main(argv) == 0

    name = "adapter_model.safetensors" if peft else "model.safetensors"
    run(tmp_path / "full")
    killed = tmp_path / "killed"
    killed.mkdir()
    shutil.copytree(tmp_path / "full" / "checkpoint-3", killed / "checkpoint-3")
    run(killed, "--resume_from_checkpoint", "true")
    final, again = load_file(str(tmp_path / "full" / name)), load_file(str(killed / name))
    assert_identical(again, final)
    start = load_file(str(tmp_path / "full" / "checkpoint-3" / name))
    assert any(not torch.equal(start[k], final[k]) for k in final)  # steps 4-5 moved the weights
    state = json.loads((killed / "trainer_state.json").read_text())
    assert state["global_step"] == 5


def test_resume_refuses_another_runs_checkpoint(tmp_path, demo_dir, bpe_tiny_model_dir, capsys):
    """A checkpoint records what produced it (run_fingerprint.json); resuming with other data or settings is one line
    and exit 2, and so is a checkpoint without optimizer state."""
    from grounding_rl.cli import main as cli

    train = tmp_path / "train.jsonl"
    shutil.copy(demo_dir / "train.jsonl", train)
    out = tmp_path / "run"

    def sft(*extra):
        return cli(["sft", "--config", "configs/demo_sft.yaml", "--model_name_or_path", str(bpe_tiny_model_dir),
                    "--train_file", str(train), "--video_root", str(demo_dir), "--output_dir", str(out),
                    "--max_train_samples", "2", "--per_device_train_batch_size", "2", "--max_steps", "1",
                    "--save_strategy", "steps", "--save_steps", "1", "--disable_tqdm", "true", "--report_to", "none",
                    *extra])

    assert sft() == 0
    saved = json.loads((out / "checkpoint-1" / "run_fingerprint.json").read_text())
    assert saved["prompt_template"] == "default" and len(saved["train_sha256"]) == 64
    saved_config = json.loads((out / "checkpoint-1" / "grounding_config.json").read_text())
    assert saved["video_layout"] == saved_config["video_layout"] == "released"  # what eval and infer will reuse
    capsys.readouterr()
    assert sft("--resume_from_checkpoint", "true", "--prompt_template", "timezero") == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "prompt_template: 'default' → 'timezero'" in err and "--output_dir" in err
    rows = train.read_text().splitlines()
    first = json.loads(rows[0])
    first["end"] = first["end"] - 0.5
    train.write_text("\n".join([json.dumps(first), *rows[1:]]) + "\n")
    assert sft("--resume_from_checkpoint", "true") == 2
    assert "train_sha256 changed" in capsys.readouterr().err
    mark = out / "checkpoint-1" / "checkpoint_complete.json"  # as save_only_model: true writes it: no optimizer
    listed = json.loads(mark.read_text())
    for name in ("optimizer.pt", "run_fingerprint.json"):
        (out / "checkpoint-1" / name).unlink()
        del listed["files"][name]
    mark.write_text(json.dumps(listed))
    assert sft("--resume_from_checkpoint", "true") == 2
    assert "holds no optimizer state" in capsys.readouterr().err


def sft_argv(demo_dir, model_dir, out, *extra):
    """A 1-step ``grounding-rl sft`` run of the demo recipe on 2 clips, checkpointed at step 1."""
    return ["sft", "--config", "configs/demo_sft.yaml", "--model_name_or_path", str(model_dir),
            "--train_file", str(demo_dir / "train.jsonl"), "--video_root", str(demo_dir), "--output_dir", str(out),
            "--max_train_samples", "2", "--per_device_train_batch_size", "2", "--max_steps", "1",
            "--save_strategy", "steps", "--save_steps", "1", "--disable_tqdm", "true", "--report_to", "none", *extra]


def saved_modes(folder):
    return {str(p.relative_to(folder)): oct(p.stat().st_mode & 0o777) for p in folder.rglob("*") if p.is_file()}


def test_two_fresh_lora_runs_with_one_seed_are_bit_identical(tmp_path, demo_dir, bpe_tiny_model_dir):
    """``sft --use_peft true`` without ``lora_target_modules``, twice from scratch with one seed: the same adapter, bit
    for bit (the seed is set before PEFT draws ``lora_A``). The default targets are the language model's seven
    projections, none of the vision tower's, and the model card says so; every saved file, safetensors included, has
    the mode ``open()`` gives under the umask (027 here: 0640)."""
    from grounding_rl.cli import main as cli

    umask = os.umask(0o027)
    try:
        for name in ("a", "b"):
            assert cli(sft_argv(demo_dir, bpe_tiny_model_dir, tmp_path / name, "--use_peft", "true", "--lora_r", "4",
                                "--lora_alpha", "8")) == 0
    finally:
        os.umask(umask)
    first, second = (load_file(str(tmp_path / name / "checkpoint-1" / "adapter_model.safetensors"))
                     for name in ("a", "b"))
    assert_identical(first, second)
    modules = {key.split(".lora_")[0] for key in first}
    assert all(".language_model.layers." in m and "visual" not in m for m in modules), sorted(modules)[:3]
    assert {m.rsplit(".", 1)[1] for m in modules} == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                                       "down_proj"}
    card = (tmp_path / "a" / "README.md").read_text()
    assert "| LoRA target modules |" in card and "vision tower and its merger are not adapted" in card
    modes = saved_modes(tmp_path / "a")
    assert {"checkpoint-1/adapter_model.safetensors", "checkpoint-1/optimizer.pt"} <= set(modes)
    assert set(modes.values()) == {"0o640"}, modes


def test_one_run_per_output_folder(tmp_path, demo_dir, bpe_tiny_model_dir, capsys):
    """A second run into a folder holding a run is one line and exit 2; resuming that run there works;
    ``--replace_output_dir true`` removes the old run's files first (none survive beside the new ones), but never a
    folder that holds no run; ``eval`` and ``infer`` refuse a folder holding full weights and an adapter, and
    ``merge-lora`` will not write one (its merged files follow the umask)."""
    from grounding_rl.cli import main as cli

    out = tmp_path / "run"
    umask = os.umask(0o027)
    try:
        assert cli(sft_argv(demo_dir, bpe_tiny_model_dir, out)) == 0
    finally:
        os.umask(umask)
    modes = saved_modes(out)
    assert modes["model.safetensors"] == modes["checkpoint-1/model.safetensors"] == "0o640"  # safetensors says 0600

    def refused_cli(argv):
        capsys.readouterr()
        assert cli(argv) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1, err
        return err

    def refused(*extra, folder=out):
        return refused_cli(sft_argv(demo_dir, bpe_tiny_model_dir, folder, *extra))

    err = refused()
    assert f"output_dir: {out} already holds a run" in err and "--resume_from_checkpoint true" in err
    assert "--replace_output_dir true" in err and "new --output_dir" in err
    assert "would delete" in refused("--resume_from_checkpoint", "true", "--replace_output_dir", "true")
    assert cli(sft_argv(demo_dir, bpe_tiny_model_dir, out, "--resume_from_checkpoint", "true")) == 0  # its own run
    (out / "checkpoint-9").mkdir()  # a stale checkpoint of the old run
    (out / "notes.txt").write_text("mine")  # a user's file: replace_output_dir deletes only what the run wrote
    (out / "eval").mkdir()
    before = sorted(p.name for p in out.rglob("*"))
    assert json.loads((out / "run_fingerprint.json").read_text())["outputs"][:2] == ["run_fingerprint.json",
                                                                                   "trainer_state.json"]
    assert refused("--replace_output_dir", "true") == (
        f"grounding-rl sft: error: replace_output_dir: {out} holds eval, notes.txt, which the run there did not "
        "write; nothing was deleted: move it out, or give a new --output_dir")
    assert sorted(p.name for p in out.rglob("*")) == before
    (out / "notes.txt").unlink()
    (out / "eval").rmdir()
    assert cli(sft_argv(demo_dir, bpe_tiny_model_dir, out, "--use_peft", "true", "--lora_r", "4",
                        "--replace_output_dir", "true")) == 0
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == ["checkpoint-1"]
    assert not list(out.rglob("model*.safetensors")) and (out / "checkpoint-1" / "adapter_model.safetensors").is_file()
    assert json.loads((out / "run_fingerprint.json").read_text())["lora"]["r"] == 4
    umask = os.umask(0o027)
    try:
        assert cli(["merge-lora", "--adapter", str(out), "--out", str(tmp_path / "merged")]) == 0
    finally:
        os.umask(umask)
    assert set(saved_modes(tmp_path / "merged").values()) == {"0o640"}
    assert "holds a LoRA adapter" in refused_cli(["merge-lora", "--adapter", str(out), "--out", str(out)])

    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "mine.txt").write_text("not a run")
    assert "holds no training run" in refused("--replace_output_dir", "true", folder=notes)
    assert (notes / "mine.txt").is_file()

    mixed = tmp_path / "mixed"  # full weights with another run's adapter beside them
    shutil.copytree(bpe_tiny_model_dir, mixed)
    shutil.copy(out / "adapter_config.json", mixed)
    video = str(demo_dir / json.loads((demo_dir / "test.jsonl").read_text().splitlines()[0])["video"])
    for argv in (["eval", "--model", str(mixed), "--data", str(demo_dir / "test.jsonl"), "--out", str(tmp_path / "ev")],
                 ["infer", "--model", str(mixed), "--video", video, "--query", "the red circle appears."]):
        assert "holds both full weights (model.safetensors) and a LoRA adapter (adapter_config.json)" in \
            refused_cli(argv)
    assert not (tmp_path / "ev").exists()


def test_an_adapter_checkpoint_with_an_unexpected_key_is_an_error(tmp_path, tiny_model_dir):
    from peft import LoraConfig, get_peft_model

    from grounding_rl.update.resume import load_adapter_weights

    def lora():
        return get_peft_model(load_policy(str(tiny_model_dir)),
                              LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))

    lora().save_pretrained(tmp_path / "adapter")
    load_adapter_weights(lora(), tmp_path / "adapter")  # intact: loads
    path = tmp_path / "adapter" / "adapter_model.safetensors"
    state = load_file(str(path))
    key = next(iter(state))
    state[key.replace("layers.0.", "layers.7.")] = state[key].clone()  # a layer the model does not have
    save_file(state, str(path), metadata={"format": "pt"})
    with pytest.raises(CheckpointLoadError, match="1 unexpected keys"):
        load_adapter_weights(lora(), tmp_path / "adapter")
    lora().save_pretrained(tmp_path / "adapter")
    state = load_file(str(path))
    state.pop(next(k for k in state if "lora_B" in k))
    save_file(state, str(path), metadata={"format": "pt"})
    with pytest.raises(CheckpointLoadError, match="1 missing keys: .*lora_B"):
        load_adapter_weights(lora(), tmp_path / "adapter")


def iou(completions, qid, **columns):
    """A stand-in ``iou`` reward by clip: the pool clip always scores 0.9 (above Time-R1's (0, 0.7]), the make-up clip
    0.2-0.5 by completion; ``varied_reward`` beside it gives every group a spread."""
    return [0.9 if q == POOL else 0.2 + 0.3 * (sum(map(ord, c)) % 2) for c, q in zip(completions, qid)]


def online_filter_trainer(out, model_dir, videos_dir, **overrides):
    """6 steps of one clip each with Time-R1's online filter (keep mean IoU reward in [0, 0.7])."""
    return make_grpo_trainer(model_dir, grpo_args(out, max_steps=6, online_difficulty_range=[0.0, 0.7], **overrides),
                             dataset(videos_dir), reward_funcs=[varied_reward, iou])


@pytest.fixture(scope="module")
def online_filter_run(tmp_path_factory, tiny_model_dir, videos_dir):
    """The uninterrupted online-filter run, a checkpoint at every step (both resume points read it): its folder,
    final weights, filter state and logged steps."""
    out = tmp_path_factory.mktemp("online_filter") / "full"
    full = online_filter_trainer(out, tiny_model_dir, videos_dir, save_steps=1)
    full.train()
    return out, weights(full), full.recipes[0].filter.state_dict(), {h["step"]: h for h in full.state.log_history
                                                                  if "loss" in h}


@pytest.mark.parametrize("at", [2, 3], ids=["epoch-end", "mid-epoch"])
def test_online_difficulty_filter_resumes_bit_identical(tmp_path, tiny_model_dir, videos_dir, online_filter_run, at):
    """2 clips, one a step, an epoch of 2 steps: after epoch 1 the online filter drops the pool clip (mean IoU reward
    0.9), so steps 3-6 train on the make-up clip alone. Resumed at checkpoint-2 (saved before the epoch's filter ran)
    or checkpoint-3 (inside epoch 2, with that epoch's reward sums), the run ends with the same weights, filter state
    and logs."""
    def run(out, **overrides):
        return online_filter_trainer(out, tiny_model_dir, videos_dir, **overrides)

    full_dir, full_weights, state, logged = online_filter_run
    assert state["active"] == [1] and state["epoch"] == 2  # the make-up clip; the filter ran after epochs 1 and 2
    assert state["history"][0] == {"epoch": 1, "kept": 1, "dropped": 1, "dropped_low": 0, "dropped_high": 1,
                                   "unscored": 0}
    assert logged[3]["data/online_kept"] == 1.0 and logged[3]["data/online_dropped"] == 1.0
    assert all(logged[s]["rewards/iou/mean"] < 0.9 for s in (3, 4, 5, 6))  # the pool clip is no longer drawn
    checkpoint = tmp_path / f"checkpoint-{at}"  # a copy: the other resume point reads the same run
    shutil.copytree(full_dir / f"checkpoint-{at}", checkpoint)
    saved = json.loads((checkpoint / "online_filter.json").read_text())
    assert saved["epoch"] == (0 if at == 2 else 1) and sum(saved["counts"]) == (8 if at == 2 else 4)

    resumed = run(tmp_path / "resumed")
    resumed.train(resume_from_checkpoint=str(checkpoint))
    assert_identical(weights(resumed), full_weights)
    assert resumed.recipes[0].filter.state_dict() == state
    wall = ("runtime", "per_second", "step_time", "timing/")  # seconds measured, not computed
    same = lambda h: {k: v for k, v in h.items() if not any(w in k for w in wall)}  # noqa: E731
    relogged = {h["step"]: h for h in resumed.state.log_history if "loss" in h}
    for step in range(at + 1, 7):
        assert same(relogged[step]) == same(logged[step])
    (checkpoint / "online_filter.json").unlink()
    from grounding_rl.errors import UserError

    with pytest.raises(UserError, match="no online_filter.json"):
        run(tmp_path / "again").train(resume_from_checkpoint=str(checkpoint))


def test_a_fingerprint_written_before_issue_46_still_resumes(tmp_path):
    """The teacher's β is recorded under its field's name (train: distillation_beta, distill: beta); a checkpoint's
    run_fingerprint.json written before records it as teacher_divergence_beta: the same value resumes, another is
    refused in one line."""
    from types import SimpleNamespace

    from grounding_rl.cli.common import _check_fingerprint
    from grounding_rl.errors import UserError
    from grounding_rl.update.recipes.distillation import Distillation

    args = SimpleNamespace(teacher_model_name_or_path="teacher", distillation_beta=0.5)
    train = SimpleNamespace(stage="train", beta=0.04)  # beta: GRPO's KL weight, not the teacher's
    assert Distillation.teacher(args, train) == ("teacher", "distillation_beta", 0.5)
    assert Distillation.teacher(args, SimpleNamespace(stage="distill", beta=1.0)) == ("teacher", "beta", 1.0)
    old = tmp_path / "run_fingerprint.json"
    for name, value in (("distillation_beta", 0.5), ("beta", 1.0)):
        new = {"teacher": "teacher", name: value, "seed": 7}
        old.write_text(json.dumps({"teacher": "teacher", "teacher_divergence_beta": value, "seed": 7}))
        _check_fingerprint(old, new, "another run", "advice")  # accepted
        old.write_text(json.dumps({"teacher": "teacher", "teacher_divergence_beta": 0.25, "seed": 7}))
        with pytest.raises(UserError, match=f"teacher_divergence_beta: 0.25 → {value}"):
            _check_fingerprint(old, new, "another run", "advice")


def test_a_fingerprint_holding_timelens_numbers_as_options_still_resumes(tmp_path):
    """Before issue 46 (point 4) the data selection recorded TimeLens's numbers as options; an old fingerprint holding
    the values difficulty_sampling: timelens fixes resumes, one holding another is refused in one line."""
    from grounding_rl.cli.common import _check_fingerprint, timelens_fixed
    from grounding_rl.errors import UserError

    new = {"data_selection": {"difficulty_sampling": "timelens", "difficulty_subset_size": 9}, "seed": 7}
    old = tmp_path / "run_fingerprint.json"
    fixed = {"difficulty_gaussian_mean": 0.05, "difficulty_gaussian_std": 0.2, "difficulty_num_bins": 20,
             "difficulty_duration_edges": [30.0, 60.0, 90.0, 120.0, 150.0, 180.0, 210.0, 240.0]}
    assert timelens_fixed() == fixed
    old.write_text(json.dumps({"data_selection": {**new["data_selection"], **fixed}, "seed": 7}))
    _check_fingerprint(old, new, "another run", "advice")  # accepted
    fresh = tmp_path / "fresh.json"
    fresh.write_text(json.dumps(new))
    _check_fingerprint(fresh, new, "another run", "advice")  # a record written now compares as it is
    old.write_text(json.dumps({"data_selection": {**new["data_selection"], **fixed, "difficulty_num_bins": 0},
                               "seed": 7}))
    with pytest.raises(UserError, match="another run .*data_selection"):
        _check_fingerprint(old, new, "another run", "advice")
