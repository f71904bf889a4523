"""GroundingGRPOTrainer on tiny random models with real clips: config, correctness, reference model, clipping,
zero-std groups, bad clips, checkpoints and resume. The core paths run for both families (``family_model_dir``:
Qwen2.5-VL and Qwen3-VL).

Small pixel budgets (≤ 16 merged tokens per frame pair) and 8-token completions keep each step at a second or two.
"""
import copy
import json
import math

import pytest
import torch

from conftest import MAKEUP, POOL, clip_dataset, grpo_config, make_grpo_trainer, varied_reward

from grounding_rl.data.dataset import GroundingDataset, VideoCollator, substitute_index
from grounding_rl.family import family_of
from grounding_rl.models.loading import load_policy, load_processor, vision_tower
from grounding_rl.update import batching
from grounding_rl.update.config import GroundingGRPOConfig
from grounding_rl.update.logprobs import completion_logps
from grounding_rl.update.trainer import GroundingGRPOTrainer

torch.set_num_threads(1)


def make_args(tmp_path, **overrides):
    settings = {"output_dir": tmp_path / "out", "logging_steps": 1, **overrides}
    return grpo_config(settings.pop("output_dir"), **settings)


def make_dataset(videos_dir, names=(POOL,)):
    return clip_dataset(videos_dir, names)


def make_trainer(tmp_path, tiny_model_dir, dataset, reward_funcs=(varied_reward,), **overrides):
    return make_grpo_trainer(tiny_model_dir, make_args(tmp_path, **overrides), dataset, reward_funcs)


# ----------------------------------------------------------------------------------------------------------- config
def test_config_rejects_bad_settings(tmp_path):
    with pytest.raises(ValueError, match="divisible by num_generations"):
        make_args(tmp_path, per_device_train_batch_size=3)
    with pytest.raises(ValueError, match="loss_type"):
        make_args(tmp_path, loss_type="ppo")
    with pytest.raises(ValueError, match="reward_weights has 1 values for 2"):
        make_args(tmp_path, reward_weights=[1.0])
    args = make_args(tmp_path, epsilon=0.3)
    assert (args.num_generations, args.epsilon_high, args.loss_type, args.beta) == (4, 0.3, "dapo", 0.0)
    # TRL's boolean spellings of scale_rewards, as they arrive from YAML (bool) or the command line (str)
    assert make_args(tmp_path, scale_rewards="True").scale_rewards == "group"
    assert make_args(tmp_path, scale_rewards=False).scale_rewards == "none"


def test_cli_parser_reads_yaml_and_overrides(tmp_path, tiny_model_dir):
    from grounding_rl.cli.common import parse_training_args
    from grounding_rl.paths import REPO_ROOT

    def parse_args(argv):
        return parse_training_args(GroundingGRPOConfig, argv, "grounding-rl train")

    config = str(REPO_ROOT / "configs" / "tiny_real_clips.yaml")
    script, args, model = parse_args(["--config", config, "--model_name_or_path", str(tiny_model_dir),
                                      "--output_dir", str(tmp_path), "--beta", "0.1"])
    assert args.beta == 0.1 and args.use_cpu and args.reward_funcs == ["iou", "format"]
    assert args.reward_weights == [5.0, 1.0] and args.video_fps == 1.0
    assert script.train_file.endswith("data/videos/annotations.jsonl")
    from grounding_rl.errors import UserError

    with pytest.raises(UserError, match="command line: unknown option --no_such_key"):
        parse_args(["--config", config, "--output_dir", str(tmp_path), "--no_such_key", "1"])


# ------------------------------------------------------------------------------------------------------ correctness
def test_vision_tower_runs_in_gradient_forward_with_the_video(tmp_path, family_model_dir, videos_dir):
    """(a) the vision tower is called with gradients enabled, on the very pixels used for generation."""
    trainer = make_trainer(tmp_path, family_model_dir, make_dataset(videos_dir), learning_rate=1e-3)
    patch = trainer.model.config.vision_config.patch_size
    visual = vision_tower(trainer.model)
    calls, grads = [], []
    visual.register_forward_hook(lambda m, args, out: calls.append((torch.is_grad_enabled(), args[0].detach().clone())))
    first_param = next(visual.parameters())
    first_param.register_hook(lambda g: grads.append(g.abs().sum().item()))
    trainer.train()
    no_grad = [x for grad_on, x in calls if not grad_on]
    with_grad = [x for grad_on, x in calls if grad_on]
    assert len(with_grad) == 1 and no_grad  # generation (no grad) then the loss forward (grad)
    assert torch.equal(with_grad[0], no_grad[0])  # the same pixel_values_videos in both
    assert with_grad[0].shape[1] == 3 * 2 * patch * patch and with_grad[0].shape[0] > 0  # 1176 or 1536
    assert grads and grads[0] > 0  # the loss reaches the vision tower


def _position_ids_recorder(model, sink):
    language_model = model.model.language_model

    def hook(module, args, kwargs):
        pos = kwargs["position_ids"]
        sink.append((torch.is_grad_enabled(), pos[-3:].detach().clone(), kwargs["inputs_embeds"].shape[1]))

    return language_model.register_forward_pre_hook(hook, with_kwargs=True)


@pytest.mark.parametrize("fps", [1.0, 2.0, 4.0])
def test_position_ids_match_in_generation_policy_and_reference(tmp_path, family_model_dir, videos_dir, fps):
    """(b) 3D RoPE ids: generation == policy forward == reference forward; Qwen2.5-VL: temporal id of frame group k
    is floor(k · tokens_per_second · 2 / fps); Qwen3-VL: the token ids they all see hold the textual timestamps."""
    # per-row encoding and prefill: the recorder reads position ids from each row's own forward (the shared path is
    # checked the same way in test_sharing.py)
    trainer = make_trainer(tmp_path, family_model_dir, make_dataset(videos_dir, (POOL, MAKEUP)), beta=0.04,
                           per_device_train_batch_size=8, video_fps=fps, share_video_encoding=False)
    assert trainer.ref_model is not None and trainer.ref_model is not trainer.model
    policy_calls, ref_calls = [], []
    _position_ids_recorder(trainer.model, policy_calls)
    _position_ids_recorder(trainer.ref_model, ref_calls)
    batches = []
    original = trainer.generate_and_score
    trainer.generate_and_score = lambda items: batches.append(original(items)) or batches[-1]
    trainer.train()

    batch = batches[0]
    generation = [pos for grad_on, pos, _ in policy_calls if not grad_on]
    (policy,) = [pos for grad_on, pos, _ in policy_calls if grad_on]
    (reference,) = [pos for _, pos, _ in ref_calls]
    assert torch.equal(policy, reference)
    generated = torch.cat(generation, dim=2)  # prefill (P) + one id per decoding step
    mask = batching.forward_inputs(batch)["attention_mask"].bool()
    length = generated.shape[2]
    valid = mask[:, :length]
    assert valid[:, -1].any()  # completion positions are compared, not only the prompt
    assert torch.equal(generated[:, valid], policy[:, :, :length][:, valid])

    if family_of(trainer.model).name == "qwen3_vl":
        _assert_textual_timestamps(trainer, batch, videos_dir)
        return
    # the model's temporal rule, on the prompt's video tokens
    tokens_per_second = trainer.model.config.vision_config.tokens_per_second
    for row in range(batch["prompt_ids"].shape[0]):
        t, h, w = batch["video_grid_thw"][row].tolist()
        per_group = h * w // 4
        video = batching.forward_inputs(batch)["mm_token_type_ids"][row] == 2
        temporal = policy[0, row][video]
        assert temporal.numel() == t * per_group
        offsets = (temporal - temporal[0]).view(t, per_group)
        assert (offsets == offsets[:, :1]).all()
        sampled_fps = 2.0 / batch["second_per_grid_ts"][row].item()
        assert sampled_fps == pytest.approx(fps)
        expected = [math.floor(k * tokens_per_second * 2 / fps) for k in range(t)]
        assert offsets[:, 0].tolist() == expected


def _assert_textual_timestamps(trainer, batch, videos_dir):
    """Qwen3-VL: the prompt ids given to generation and to both forwards carry ``<t seconds>`` per frame pair, the
    mean presentation time of the pair in the clip the row uses."""
    import re

    from grounding_rl.data.video import sample_frames

    prompt = batch["prompt_ids"]
    assert torch.equal(batching.generation_inputs(batch)["input_ids"], prompt)
    assert torch.equal(batching.forward_inputs(batch)["input_ids"][:, :prompt.shape[1]], prompt)
    settings = family_of(trainer.model).video_settings(trainer.args.video_settings)
    expected = {}
    for name in (POOL, MAKEUP):
        times = sample_frames(videos_dir / name, settings).timestamps
        expected[name] = [float(f"{(times[k] + times[k + 1]) / 2:.1f}") for k in range(0, len(times), 2)]
    assert expected[POOL] != expected[MAKEUP]
    seen = set()
    for row in range(prompt.shape[0]):
        text = trainer.processing_class.tokenizer.decode(prompt[row])
        stamps = [float(x) for x in re.findall(r"<(\d+\.\d) seconds>", text)]
        assert len(stamps) == batch["video_grid_thw"][row, 0].item()
        (name,) = [n for n, e in expected.items() if e == stamps]
        seen.add(name)
    assert seen == {POOL, MAKEUP}


def _summed_logp(model, batch, row):
    with torch.no_grad():
        logps = completion_logps(model, batch)
    return (logps[row] * batch["completion_mask"][row]).sum().item()


def test_sign_of_the_update_follows_the_advantage(tmp_path, family_model_dir, videos_dir):
    """(c) one SGD step on a single completion: A > 0 raises its summed log-prob, A < 0 lowers it."""
    trainer = make_trainer(tmp_path, family_model_dir, make_dataset(videos_dir), loss_type="grpo")
    items = trainer.data_collator([trainer.train_dataset[0]] * 4)
    batch = trainer.generate_and_score(items)
    for sign in (+1.0, -1.0):
        one = batching.select_rows(batch, [0])
        one["advantages"] = torch.tensor([sign])
        model = copy.deepcopy(trainer.model).train()
        before = _summed_logp(model, one, 0)
        loss = trainer.compute_loss(model, one)
        loss.backward()
        with torch.no_grad():
            for p in model.parameters():
                if p.grad is not None:
                    p -= 1e-3 * p.grad
        after = _summed_logp(model, one, 0)
        assert (after - before) * sign > 1e-5, (sign, before, after)


def test_no_reference_model_when_beta_is_zero(tmp_path, family_model_dir, videos_dir):
    """(d)"""
    trainer = make_trainer(tmp_path, family_model_dir, make_dataset(videos_dir), beta=0.0)
    assert trainer.ref_model is None
    trainer.train()
    assert "kl" not in trainer.state.log_history[0]


def test_num_iterations_two_moves_the_ratio_and_logs_clipping(tmp_path, tiny_model_dir, videos_dir):
    """(e) the second pass over one generation batch sees π_θ ≠ π_old; clip metrics are logged."""
    trainer = make_trainer(tmp_path, tiny_model_dir, make_dataset(videos_dir), num_iterations=2, max_steps=2,
                           learning_rate=1e-2, epsilon=1e-3, lr_scheduler_type="constant")
    trainer.train()
    first, second = trainer.state.log_history[0], trainer.state.log_history[1]
    assert first["ratio/mean"] == pytest.approx(1.0, abs=1e-6)
    assert first["clip_ratio/region_mean"] == 0.0
    assert abs(second["ratio/mean"] - 1.0) > 1e-4
    assert second["clip_ratio/region_mean"] > 0.0
    for key in ("clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean"):
        assert key in first and key in second
    for key in ("reward", "reward_std", "rewards/varied_reward/mean", "rewards/varied_reward/std",
                "completions/mean_length", "completions/clipped_ratio", "frac_reward_zero_std",
                "parse_failure_rate", "data/skipped_samples"):
        assert key in first, key
    assert first["parse_failure_rate"] == 1.0  # a random model never writes an answer
    for key in ("step_time", "timing/generate", "timing/reward", "timing/update"):  # phase timings, seconds
        assert math.isfinite(first[key]) and first[key] >= 0.0, key
    assert "timing/generate" not in second and "timing/ref" not in first  # one generation for two steps; β = 0
    assert 0 < first["completions/mean_length"] <= 8


def test_zero_variance_groups_are_counted_and_have_advantage_zero(tmp_path, tiny_model_dir, videos_dir):
    trainer = make_trainer(tmp_path, tiny_model_dir, make_dataset(videos_dir), reward_funcs=["iou", "format"],
                           beta=0.04)
    items = trainer.data_collator([trainer.train_dataset[0]] * 4)
    batch = trainer.generate_and_score(items)
    assert batch["advantages"].tolist() == [0.0] * 4 and batch["completion_mask"].sum() > 0  # kept, no advantage
    assert trainer._metrics["frac_reward_zero_std"] == [1.0]


@pytest.mark.parametrize("accumulation, stored", [(3, True), (2, False)])
def test_trainer_stores_old_logps_under_trls_rule(tmp_path, tiny_model_dir, videos_dir, accumulation, stored):
    """gradient_accumulation_steps 3, steps_per_generation 2: micro-step 3 trains on part 1 of a batch generated
    before the first optimizer step, so π_old log-probs are stored (the old rule skipped them); with 2 they are not
    needed (grpo.needs_old_logps, pinned over 1..4 in test_grpo_math)."""
    trainer = make_trainer(tmp_path, tiny_model_dir, make_dataset(videos_dir), steps_per_generation=2,
                           gradient_accumulation_steps=accumulation)
    batch = trainer.generate_and_score(trainer.data_collator([trainer.train_dataset[0]] * 8))
    assert ("old_logps" in batch) is stored
    if stored:
        assert batch["old_logps"].shape == batch["completion_ids"].shape


def test_long_prompt_is_an_error_naming_the_sample(tmp_path, tiny_model_dir, videos_dir):
    trainer = make_trainer(tmp_path, tiny_model_dir, make_dataset(videos_dir), max_prompt_length=20)
    items = trainer.data_collator([trainer.train_dataset[0]] * 4)
    with pytest.raises(ValueError, match=f"qid {POOL}.*max_prompt_length 20"):
        trainer.generate_and_score(items)


# ------------------------------------------------------------------------------------------------------ bad samples
def test_bad_clip_is_substituted_deterministically(tmp_path, tiny_model_dir, videos_dir):
    """A broken file becomes the next loadable sample, the same on every rank, and is counted."""
    broken = tmp_path / "broken.mp4"
    broken.write_bytes(b"not a video" * 100)
    dataset = GroundingDataset([
        {"video": str(broken), "query": "q0", "start": 0.0, "end": 1.0, "duration": 5.0, "qid": "bad"},
        {"video": str(videos_dir / POOL), "query": "q1", "start": 1.0, "end": 2.0, "duration": 10.0, "qid": "ok"},
    ])
    rank0 = VideoCollator(dataset, make_args(tmp_path).video_settings)
    rank1 = VideoCollator(dataset, make_args(tmp_path).video_settings)
    out0, out1 = rank0([dataset[0]] * 2), rank1([dataset[0]] * 2)
    assert substitute_index(0, 1, 2) == 1
    assert [o["qid"] for o in out0 + out1] == ["ok"] * 4
    assert [o["substituted_from"] for o in out0] == [0, 0]
    assert out0[0]["clip"].frames.shape == out1[1]["clip"].frames.shape  # a video, never a text-only item

    trainer = make_trainer(tmp_path, tiny_model_dir, dataset, per_device_train_batch_size=8)
    trainer.train()
    assert trainer.state.log_history[0]["data/skipped_samples"] == 1.0

    # unreadable videos are counted as they come against max_missing_fraction: 1 of 2 is more than 0.4
    from grounding_rl.errors import UserError

    strict = GroundingGRPOTrainer(load_policy(str(tiny_model_dir)), make_args(tmp_path, per_device_train_batch_size=8),
                                  dataset, load_processor(str(tiny_model_dir)), reward_funcs=[varied_reward],
                                  max_missing_fraction=0.4)
    with pytest.raises(UserError, match="training: unreadable 1 of 2 videos .*broken.mp4"):
        strict.train()


# ------------------------------------------------------------------------------------------------------ checkpoints
def test_checkpoints_hold_grounding_config_and_resume(tmp_path, family_model_dir, videos_dir):
    trainer = make_trainer(tmp_path, family_model_dir, make_dataset(videos_dir), save_strategy="steps", save_steps=1,
                           prompt_template="timezero")
    trainer.train()
    trainer.save_model()
    for folder in (tmp_path / "out" / "checkpoint-1", tmp_path / "out"):
        saved = json.loads((folder / "grounding_config.json").read_text())
        assert saved["prompt_template"] == "timezero"
        assert saved["video"]["fps"] == 1.0 and saved["video"]["max_pixels"] == 28 * 28 * 16
        assert saved["video"]["pixel_factor"] == family_of(trainer.model).pixel_factor  # frames as sampled
    resumed = make_trainer(tmp_path, family_model_dir, make_dataset(videos_dir), save_strategy="no", max_steps=2,
                           prompt_template="timezero")
    resumed.train(resume_from_checkpoint=str(tmp_path / "out" / "checkpoint-1"))
    assert resumed.state.global_step == 2


def test_a_checkpoint_reloads_with_plain_transformers(tmp_path, family_model_dir, videos_dir):
    """What a user pushes to the Hub: the processor as it was loaded (no left padding left behind by generation),
    ``use_cache: true`` in config.json, a model card with the settings; plain transformers reloads it."""
    from transformers import AutoModelForImageTextToText, AutoProcessor

    loaded_side = load_processor(str(family_model_dir)).tokenizer.padding_side
    trainer = make_trainer(tmp_path, family_model_dir, make_dataset(videos_dir), save_strategy="steps", save_steps=1,
                           activation_checkpointing=True, log_completions=True, num_completions_to_print=3)
    trainer.train()
    logged = [json.loads(line) for line in (tmp_path / "out" / "completions.jsonl").read_text().splitlines()]
    assert len(logged) == 3 and {r["step"] for r in logged} == {1}
    assert set(logged[0]) == {"step", "qid", "query", "video", "frame_times", "completion", "parsed", "ground_truth",
                              "rewards", "advantage"}
    assert logged[0]["rewards"]["varied_reward"] == pytest.approx(varied_reward([logged[0]["completion"]])[0], abs=1e-6)
    folder = tmp_path / "out" / "checkpoint-1"
    model = AutoModelForImageTextToText.from_pretrained(folder)
    processor = AutoProcessor.from_pretrained(folder)
    assert type(model).__name__ == type(trainer.accelerator.unwrap_model(trainer.model)).__name__
    saved = json.loads((folder / "config.json").read_text())
    assert saved["text_config"]["use_cache"] is True and model.config.text_config.use_cache is True
    assert processor.tokenizer.padding_side == loaded_side == trainer.processing_class.tokenizer.padding_side
    from huggingface_hub import ModelCard

    assert ModelCard.load(folder / "README.md").data.base_model == str(family_model_dir)
    card = (folder / "README.md").read_text()
    assert "| prompt template | `default` |" in card and "| video fps | `1.0` |" in card
    assert "varied_reward" in card and "Training command:" in card


def test_resume_uses_the_buffered_generation_of_its_step(tmp_path, tiny_model_dir, videos_dir, monkeypatch):
    """steps_per_generation 2: one generation feeds two optimizer steps. Uninterrupted, steps 1-4 use parts 0, 1 of
    generation A and 0, 1 of generation B. Checkpoints are written only between generations (save_steps 1 is
    refused); resumed at checkpoint-2, steps 3-4 generate once, for the same clips as the uninterrupted run's second
    generation, and train on parts 0 then 1."""
    import grounding_rl.update.trainer as trainer_module

    log = []
    original_generate = trainer_module.GroundingGRPOTrainer.generate_and_score
    original_prepare = trainer_module.GroundingGRPOTrainer._prepare_inputs

    def generate(self, items):
        log.append(("generate", self.state.global_step, tuple(it["index"] for it in items)))
        return original_generate(self, items)

    def prepare(self, batch):
        part = original_prepare(self, batch)
        log.append(("train", self.state.global_step + 1, self._micro_step % self.args.steps_per_generation))
        return part

    monkeypatch.setattr(trainer_module.GroundingGRPOTrainer, "generate_and_score", generate)
    monkeypatch.setattr(trainer_module.GroundingGRPOTrainer, "_prepare_inputs", prepare)
    dataset = make_dataset(videos_dir, names=(POOL, MAKEUP))
    with pytest.raises(ValueError, match="save_steps 1 is not a multiple of the generation window of 2"):
        make_args(tmp_path, steps_per_generation=2, save_strategy="steps", save_steps=1)
    common = dict(steps_per_generation=2, save_strategy="steps", save_steps=2, max_steps=4, save_only_model=False)
    make_trainer(tmp_path, tiny_model_dir, dataset, **common).train()
    full = list(log)
    generations = [entry for entry in full if entry[0] == "generate"]
    assert [g[1] for g in generations] == [0, 2]  # before steps 1 and 3
    assert [(e[1], e[2]) for e in full if e[0] == "train"] == [(1, 0), (2, 1), (3, 0), (4, 1)]
    assert generations[0][2] != generations[1][2]  # the second epoch draws another order

    log.clear()
    make_trainer(tmp_path, tiny_model_dir, dataset, **{**common, "output_dir": str(tmp_path / "b")}).train(
        resume_from_checkpoint=str(tmp_path / "out" / "checkpoint-2"))
    assert [e[:2] for e in log if e[0] == "generate"] == [("generate", 2)]
    assert [(e[1], e[2]) for e in log if e[0] == "train"] == [(3, 0), (4, 1)]
    assert log[0][2] == generations[1][2]  # the same clips as the uninterrupted run's second generation

    # a checkpoint of the version before groups were shuffled cannot continue exactly with steps_per_generation 2
    import shutil

    from grounding_rl.errors import UserError

    old = tmp_path / "old" / "checkpoint-2"
    shutil.copytree(tmp_path / "out" / "checkpoint-2", old)
    (old / "rollout_format.json").unlink()
    with pytest.raises(UserError, match="written by an older version.*steps_per_generation > 1 shuffles the groups"):
        make_trainer(tmp_path, tiny_model_dir, dataset, **{**common, "output_dir": str(tmp_path / "c")}).train(
            resume_from_checkpoint=str(old))


# TRL 1.16 GRPOConfig defaults that ours changes on purpose (the README's configs section says why):
DELIBERATE_DIFFERENCES = {
    "num_generations": (4, 8),  # the design's G
    "bf16": (False, None),  # TrainingArguments' default: CPU runs work as they are; the GPU recipes set bf16: true
    # TrainingArguments' default (off: None in transformers 5.24, False in 5.19); the GPU recipes turn it on
    "gradient_checkpointing": ("TrainingArguments", True),
}


def test_the_data_order_follows_data_seed(tmp_path, tiny_model_dir, videos_dir):
    """GRPO's sampler is seeded by ``data_seed`` when set, else by ``seed`` (transformers' rule for its samplers; TRL's
    GRPO sampler reads ``seed`` only), so a ``data_seed`` is never ignored."""
    trainer = make_trainer(tmp_path, tiny_model_dir, make_dataset(videos_dir, (POOL, MAKEUP)), seed=3, data_seed=11)
    assert trainer._get_train_sampler().seed == 11
    trainer.args.data_seed = None
    assert trainer._get_train_sampler().seed == 3


def test_trl_named_fields_keep_trl_defaults():
    import dataclasses

    import trl
    from transformers import TrainingArguments

    def default(f):
        if f.default is not dataclasses.MISSING:
            return f.default
        return f.default_factory() if f.default_factory is not dataclasses.MISSING else None

    from grounding_rl.update.recipes import recipe_arguments

    ours = {f.name: f for cls in (GroundingGRPOConfig, *recipe_arguments()) for f in dataclasses.fields(cls)}
    trl_fields = {f.name: f for f in dataclasses.fields(trl.GRPOConfig)}
    differ = {name: (default(ours[name]), default(trl_fields[name])) for name in ours
              if name in trl_fields and default(ours[name]) != default(trl_fields[name])}
    base_fields = {f.name: f for f in dataclasses.fields(TrainingArguments)}
    expected = {name: (default(base_fields[name]) if ours_default == "TrainingArguments" else ours_default, trl_default)
                for name, (ours_default, trl_default) in DELIBERATE_DIFFERENCES.items()}
    assert differ == expected
    from grounding_rl.update.arguments import ACTIVATION_CHECKPOINTING_NAMES

    assert sorted(n for n in ours if n not in trl_fields and n not in base_fields
                  and n not in ACTIVATION_CHECKPOINTING_NAMES) == [
        "crop_spend", "difficulty_mean_reward", "difficulty_p_mean", "difficulty_p_std", "difficulty_range",
        "difficulty_sampling",
        "difficulty_subset_size", "distillation_beta", "distillation_weight",
        "dynamic_sampling", "eval_file", "eval_max_samples", "loss_top_k", "max_num_gen_batches",
        "max_prompt_length", "online_difficulty_range", "prompt_template",
        "reward_funcs", "reward_shaping", "share_prompt_prefix",
        "share_video_encoding", "teacher_model_init_kwargs", "teacher_model_name_or_path", "two_pass_zoom",
        "use_gt_injection", "video_budget_lowers_fps", "video_cover_tail", "video_fps", "video_layout",
        "video_max_frames", "video_max_pixels", "video_min_frames", "video_min_pixels", "video_min_tokens",
        "video_sampler", "video_total_pixels", "video_total_tokens", "zoom_margin", "zoom_spend"]
    for name in ("beta", "epsilon", "loss_type", "scale_rewards", "temperature", "num_iterations", "log_completions"):
        assert ours[name].metadata["help"].startswith(trl_fields[name].metadata["help"].split(".")[0])


# ------------------------------------------------------------------------------------------------------ helpers
def test_completion_mask_stops_at_first_eos():
    from grounding_rl.rollout.generation import completion_mask

    ids = torch.tensor([[5, 7, 2, 9, 2], [5, 6, 7, 8, 9], [3, 3, 3, 1, 1]])
    mask, truncated = completion_mask(ids, [2, 3])
    assert mask.tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]]
    assert truncated.tolist() == [False, True, False]


def test_select_and_split_rows_keep_pixels_with_their_rows():
    grid = torch.tensor([[1, 2, 2], [2, 2, 2], [1, 2, 4]])  # 4, 8, 8 patches
    pixels = torch.arange(20).float().unsqueeze(1).expand(20, 3)
    batch = {"pixel_values_videos": pixels, "video_grid_thw": grid, "prompt_ids": torch.tensor([[0], [1], [2]]),
             "num_items_in_batch": torch.tensor(7), "qid": ["a", "b", "c"]}
    picked = batching.select_rows(batch, [2, 0, 0])
    assert picked["prompt_ids"].flatten().tolist() == [2, 0, 0] and picked["qid"] == ["c", "a", "a"]
    assert picked["pixel_values_videos"][:, 0].tolist() == list(range(12, 20)) + [0, 1, 2, 3] * 2
    assert picked["num_items_in_batch"].item() == 7
    with pytest.raises(ValueError, match="3 rows into 2"):
        batching.split_rows(batch, 2)


def test_config_checks_validation_during_training(tmp_path):
    with pytest.raises(ValueError, match="eval_strategy 'steps' needs eval_file"):
        make_args(tmp_path, eval_strategy="steps", eval_steps=1)
    with pytest.raises(ValueError, match="eval_file is set but eval_strategy is 'no'"):
        make_args(tmp_path, eval_file="test.jsonl")
    with pytest.raises(ValueError, match="metric_for_best_model 'loss' is not an evaluation metric"):
        make_args(tmp_path, eval_strategy="steps", eval_steps=1, eval_file="t.jsonl", metric_for_best_model="loss")
    args = make_args(tmp_path, eval_strategy="steps", eval_steps=2, eval_file="t.jsonl", save_strategy="steps",
                     save_steps=2, load_best_model_at_end=True)
    assert (args.metric_for_best_model, args.greater_is_better) == ("mIoU", True)
    assert make_args(tmp_path, eval_strategy="steps", eval_steps=1, eval_file="t.jsonl",
                     metric_for_best_model="parse_failure_rate").greater_is_better is False
    with pytest.raises(ValueError, match=r"online_difficulty_range must be \[low, high\]"):
        make_args(tmp_path, online_difficulty_range=[0.7, 0.2])
    with pytest.raises(ValueError, match="difficulty_sampling 'gauss' is not one of"):
        make_args(tmp_path, difficulty_sampling="gauss")


# ----------------------------------------------------------------------------------------------------------- recipes
def test_ground_truth_injection_scores_and_raises_the_injected_answer(tmp_path, tiny_model_dir, videos_dir):
    """use_gt_injection: the last completion of each group is the ground-truth answer in the template's format,
    scored by the rewards (IoU ≈ 1, format 1) while the random model's samples score 0, so it gets the group's
    positive advantage; its summed log-prob under π_θ rises after one optimizer step; logged rewards leave it out."""
    from grounding_rl.prompts.templates import answer_text

    trainer = make_trainer(tmp_path, tiny_model_dir, make_dataset(videos_dir), reward_funcs=["iou", "format"],
                           use_gt_injection=True, max_completion_length=40, learning_rate=1e-3,
                           lr_scheduler_type="constant")
    captured = {}
    original = trainer.generate_and_score

    def capture(items):
        captured["batch"] = batch = original(items)
        captured["before"] = _summed_logp(copy.deepcopy(trainer.model).eval(), batch, 3)
        return batch

    trainer.generate_and_score = capture
    trainer.train()
    batch = captured["batch"]
    tokenizer = trainer.processing_class.tokenizer
    n = int(batch["completion_mask"][3].sum())
    assert tokenizer.decode(batch["completion_ids"][3, :n], skip_special_tokens=True) == answer_text(1.0, 4.0)
    assert batch["advantages"][3] > 0 and (batch["advantages"][:3] < 0).all()
    after = _summed_logp(trainer.model.eval(), batch, 3)
    assert after > captured["before"] + 1e-3, (captured["before"], after)
    log = trainer.state.log_history[0]
    assert log["rewards/iou/mean"] == 0.0 and log["gt/advantage"] > 0  # the 3 sampled rows only


def test_dynamic_sampling_draws_until_groups_have_spread(tmp_path, tiny_model_dir, videos_dir):
    """Two clips, G 2, 2 groups per step: the reward varies inside POOL's groups only. The first draw keeps one
    group, one extra draw (both clips again) the other: 2 batches, 4 groups drawn, 2 dropped, none filled, every row
    trained. With a constant reward every draw is dropped: max_num_gen_batches draws, then zero-std fill, masked."""
    def half_varied(completions, qid, **columns):
        return [varied_reward([c])[0] if q == POOL else 0.5 for c, q in zip(completions, qid)]

    dataset = make_dataset(videos_dir, names=(POOL, MAKEUP))
    trainer = make_trainer(tmp_path, tiny_model_dir, dataset, reward_funcs=[half_varied], num_generations=2,
                           dynamic_sampling=True, max_num_gen_batches=3)
    items = trainer.data_collator([dataset[0], dataset[0], dataset[1], dataset[1]])
    batch = trainer.generate_and_score(items)
    metrics = {k: v[-1] for k, v in trainer._metrics.items()}
    assert metrics["dynamic_sampling/gen_batches"] == 2.0
    assert (metrics["dynamic_sampling/groups_drawn"], metrics["dynamic_sampling/groups_dropped"],
            metrics["dynamic_sampling/groups_filled"]) == (4.0, 2.0, 0.0)
    assert batch["completion_ids"].shape[0] == 4 and (batch["completion_mask"].sum(dim=1) > 0).all()
    assert (batch["advantages"] != 0).all()

    trainer = make_trainer(tmp_path, tiny_model_dir, dataset, reward_funcs=["iou"], num_generations=2,
                           dynamic_sampling=True, max_num_gen_batches=3)
    batch = trainer.generate_and_score(items)
    metrics = {k: v[-1] for k, v in trainer._metrics.items()}
    assert metrics["dynamic_sampling/gen_batches"] == 3.0 and metrics["dynamic_sampling/groups_filled"] == 2.0
    assert batch["completion_mask"].sum() == 0 and batch["completion_ids"].shape[0] == 4


def test_dynamic_sampling_logs_exactly_the_trained_groups(tmp_path, tiny_model_dir, videos_dir):
    """The rollout metrics and logged completions come once per generation, from the rows the loss trains on: with
    two draws, ``rewards/*`` is the mean over the kept groups only and every logged row is a trained row."""
    def half_varied(completions, qid, **columns):
        return [varied_reward([c])[0] if q == POOL else 0.5 for c, q in zip(completions, qid)]

    dataset = make_dataset(videos_dir, names=(POOL, MAKEUP))
    trainer = make_trainer(tmp_path, tiny_model_dir, dataset, reward_funcs=[half_varied], num_generations=2,
                           dynamic_sampling=True, max_num_gen_batches=3, log_completions=True)
    batch = trainer.generate_and_score(trainer.data_collator([dataset[0], dataset[0], dataset[1], dataset[1]]))
    assert trainer._metrics["dynamic_sampling/gen_batches"] == [2.0]
    logged = trainer.completions
    texts = trainer.processing_class.batch_decode(
        [ids[:int(m.sum())] for ids, m in zip(batch["completion_ids"], batch["completion_mask"])],
        skip_special_tokens=True)
    assert logged["completion"] == texts and logged["qid"] == [POOL] * 4  # the two kept POOL groups
    trained = half_varied(texts, [POOL] * 4)
    assert trainer._metrics["rewards/half_varied/mean"] == [pytest.approx(sum(trained) / 4)]  # once, not per draw
    assert logged["advantage"].tolist() == pytest.approx(batch["advantages"].tolist())
    assert len(trainer._metrics["timing/dynamic_sampling"]) == 1 and trainer._metrics["frac_reward_zero_std"] == [0.0]


def test_reward_functions_get_what_trl_gives_them(tmp_path, tiny_model_dir, videos_dir):
    """Every dataset column, trainer_state, log_metric and log_extra (TRL 1.16 ``_calculate_rewards``); a function
    returning another number of values than completions is named in one line."""
    from grounding_rl.errors import UserError

    seen = {}

    def spy(completions, trainer_state, log_metric, log_extra, **columns):
        seen.update(columns, step=trainer_state.global_step)
        log_metric("spy/count", len(completions))
        log_extra("spy_note", [f"row{i}" for i in range(len(completions))])
        return varied_reward(completions)

    trainer = make_trainer(tmp_path, tiny_model_dir, make_dataset(videos_dir), reward_funcs=[spy],
                           log_completions=True)
    trainer.generate_and_score(trainer.data_collator([trainer.train_dataset[0]] * 4))
    assert seen["video"] == [str(videos_dir / POOL)] * 4 and seen["index"] == [0] * 4 and seen["step"] == 0
    assert seen["duration"] == [6.5] * 4 and seen["prompt_template"] == ["default"] * 4
    assert "clip" not in seen and len(seen["completion_ids"]) == 4
    assert trainer._metrics["spy/count"] == [4.0]
    assert trainer.completions["extra"] == {"spy_note": ["row0", "row1", "row2", "row3"]}

    def short(completions, **columns):
        return [0.0] * (len(completions) - 1)

    trainer.reward_funcs, trainer.reward_func_names = [short], ["short"]
    with pytest.raises(UserError, match="reward function 'short' returned 3 values for 4 completions"):
        trainer.generate_and_score(trainer.data_collator([trainer.train_dataset[0]] * 4))


def test_groups_are_shuffled_whole_by_their_own_generator():
    """TRL shuffles the generation batch before the split: here whole groups, from a generator of its own (seed, step,
    generation), the global RNG untouched; the same arguments give the same order."""
    from grounding_rl.update.rollout import group_permutation

    ids = torch.tensor([5, 5, 9, 9, 2, 2, 7, 7])
    state = torch.get_rng_state()
    orders = {tuple(group_permutation(ids, 0, step, generation)) for step in range(4) for generation in range(2)}
    assert torch.equal(torch.get_rng_state(), state)
    assert len(orders) > 1
    for order in orders:
        assert sorted(order) == list(range(8))
        assert all(order[k] // 2 == order[k + 1] // 2 and order[k] % 2 == 0 for k in range(0, 8, 2))
    assert group_permutation(ids, 3, 2, 1) == group_permutation(ids, 3, 2, 1)


def test_recipe_settings_are_checked(tmp_path):
    with pytest.raises(ValueError, match="max_num_gen_batches must be ≥ 1"):
        make_args(tmp_path, dynamic_sampling=True, max_num_gen_batches=0)
    with pytest.raises(ValueError, match="reward_shaping 'tempsamp' shapes the 'iou' reward"):
        make_args(tmp_path, reward_shaping="tempsamp", reward_funcs=["tiou", "format"])
    with pytest.raises(ValueError, match="reward_shaping 'gauss' is not one of"):
        make_args(tmp_path, reward_shaping="gauss")


def test_a_sampled_vision_placeholder_is_cut_not_a_crash(tmp_path, tiny_model_dir, videos_dir):
    """A completion that samples <|video_pad|> would make every later forward fail ("Video features and video tokens
    do not match"): it is cut before that token (kept tokens unchanged, counted as truncated), and the loss runs."""
    from grounding_rl.rollout.generation import cut_at_tokens

    ids, keep = cut_at_tokens(torch.tensor([[5, 9, 6], [5, 6, 7]]), [9], 0)
    assert ids.tolist() == [[5, 0, 0], [5, 6, 7]] and keep.tolist() == [[1, 0, 0], [1, 1, 1]]

    trainer = make_trainer(tmp_path, tiny_model_dir, make_dataset(videos_dir))
    video_pad = trainer.model.config.video_token_id
    assert video_pad in trainer.placeholder_ids
    sample = trainer.rollout_engine.generate

    def with_placeholder(model, inputs, params):
        out = sample(model, inputs, params)
        out[0, 2] = video_pad
        return out

    trainer.rollout_engine.generate = with_placeholder
    batch = trainer.generate_and_score(trainer.data_collator([trainer.train_dataset[0]] * 4))
    assert video_pad not in batch["completion_ids"].tolist()[0]
    assert batch["completion_mask"][0].tolist()[2:] == [0] * (batch["completion_mask"].size(1) - 2)
    assert trainer._metrics["completions/placeholder_cut_ratio"][-1] == 0.25
    assert torch.isfinite(trainer.compute_loss(trainer.model, batch))


def test_rollout_rows_select_and_concatenate():
    """A Rollout's rows are selected and concatenated field by field; completions widen with pad (mask 0, NaN
    sampling log-prob) and the prompt tensors are rebuilt for the joined items."""
    from grounding_rl.update.rollout import Rollout

    def rollout(n, width, offset):
        grid = torch.tensor([[1, 1, 2]] * n)
        return Rollout(
            items=[{"index": offset + i} for i in range(n)],
            batch={"video_grid_thw": grid, "pixel_values_videos": torch.arange(2 * n).float().unsqueeze(1),
                   "prompt_ids": torch.arange(n).unsqueeze(1) + offset},
            completion_ids=torch.full((n, width), 7), completion_mask=torch.ones(n, width, dtype=torch.int),
            lengths=torch.full((n,), width), truncated=torch.zeros(n, dtype=torch.bool),
            placeholder_cut=torch.zeros(n, dtype=torch.bool), texts=[f"t{offset + i}" for i in range(n)],
            rewards_per_func=torch.arange(n).float().unsqueeze(1) + offset, rewards=torch.arange(n).float() + offset,
            advantages=torch.zeros(n), zero_std=torch.zeros(n, dtype=torch.bool),
            scale_zero_std=torch.zeros(n, dtype=torch.bool), group_ids=(torch.arange(n) + offset) // 2,
            is_gt=torch.zeros(n, dtype=torch.bool), sampling_logps=torch.zeros(n, width),
            extra={"note": [offset + i for i in range(n)]})

    a, b = rollout(4, 2, 0), rollout(2, 3, 10)
    picked = a.select([3, 0])
    assert picked.texts == ["t3", "t0"] and picked.batch["prompt_ids"].flatten().tolist() == [3, 0]
    assert picked.batch["pixel_values_videos"].flatten().tolist() == [6.0, 7.0, 0.0, 1.0]
    assert picked.group_ids.tolist() == [1, 0] and picked.extra == {"note": [3, 0]}
    joined = Rollout.concat([picked, b], lambda items: {"rebuilt": [it["index"] for it in items]}, pad_token_id=0)
    assert joined.batch == {"rebuilt": [3, 0, 10, 11]} and len(joined) == 4
    assert joined.completion_ids.tolist() == [[7, 7, 0], [7, 7, 0], [7, 7, 7], [7, 7, 7]]
    assert joined.completion_mask[:, 2].tolist() == [0, 0, 1, 1]
    assert torch.isnan(joined.sampling_logps[:2, 2]).all() and joined.rewards.tolist() == [3.0, 0.0, 10.0, 11.0]
