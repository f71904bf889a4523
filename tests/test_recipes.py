"""The GPU recipes in configs/: each parses through the training parser, holds the values its
source comment promises, fits its prompts in max_prompt_length, and names a model whose real size (instantiated on
the ``meta`` device from ../shared/models/<name>/config.json, no weights) is the one the recipe is written for."""
from __future__ import annotations

import functools
import json
import re
from pathlib import Path

import pytest
import torch
import yaml

from grounding_rl.paths import REPO_ROOT

CONFIGS = REPO_ROOT / "configs"

# Parameter counts measured with transformers 5.24 on the meta device (all parameters, vision tower included; the 3B
# ties its input and output embeddings, counted once).
SIZE_7B = (8.28e9, 8.30e9)  # measured 8,292,166,656
SIZE_3B = (3.75e9, 3.76e9)  # measured 3,754,622,976
SIZE_8B = (8_767_123_696, 8_767_123_696)  # Qwen3-VL-8B, ../shared/README.md
VISION_PARAMS = (0.66e9, 0.68e9)  # measured 676,550,144 (7B) and 668,684,288 (3B)
QWEN3_VISION_PARAMS = (576_388_336, 576_388_336)  # Qwen3-VL-8B's tower, DeepStack mergers included
TIMELENS_PIXELS = 14336 * 32 * 32  # 14,680,064: TimeLens's training budget for Qwen3-VL (32·32 pixels a token)
TIMELENS2_PIXELS = 16384 * 32 * 32  # 16,777,216: TimeLens2's TOTAL_TOKENS 16384 (grpo/scripts/train_grpo_*b.sh)

TIMEZERO_PIXELS = 3584 * 28 * 28  # 2,809,856
MIN_PIXELS = 16 * 28 * 28  # 12,544

EXPECTED = {
    "qwen2_5_vl_7b_charades_timezero.yaml": dict(
        size=SIZE_7B, num_generations=8, beta=0.04, epsilon=0.2, learning_rate=1e-6, max_completion_length=1024,
        video_fps=2.0, video_total_pixels=TIMEZERO_PIXELS, video_min_pixels=MIN_PIXELS, prompt_template="timezero",
        reward_funcs=["iou", "format"], loss_type="grpo", freeze_vision_tower=False, use_peft=False,
        train_file="data/charades_sta/train.jsonl"),
    "qwen2_5_vl_7b_activitynet_timezero.yaml": dict(
        size=SIZE_7B, num_generations=8, beta=0.04, epsilon=0.2, learning_rate=1e-6, max_completion_length=1024,
        video_fps=2.0, video_total_pixels=TIMEZERO_PIXELS, video_min_pixels=MIN_PIXELS, prompt_template="timezero",
        reward_funcs=["iou", "format"], loss_type="grpo", freeze_vision_tower=False, use_peft=False,
        train_file="data/activitynet/train.jsonl"),
    "qwen2_5_vl_3b_charades_time_r1.yaml": dict(
        size=SIZE_3B, num_generations=8, beta=0.0, epsilon=0.2, learning_rate=1e-6, max_completion_length=1024,
        video_fps=2.0, video_total_pixels=TIMEZERO_PIXELS, video_min_pixels=MIN_PIXELS, prompt_template="timezero",
        reward_funcs=["tiou", "format"], loss_type="bnpo", freeze_vision_tower=True, use_peft=False,
        train_file="data/charades_sta/train.jsonl"),
    "qwen2_5_vl_3b_lora_24gb.yaml": dict(
        size=SIZE_3B, num_generations=4, beta=0.0, epsilon=0.2, learning_rate=1e-5, max_completion_length=512,
        video_fps=2.0, video_total_pixels=1024 * 28 * 28, video_min_pixels=MIN_PIXELS, prompt_template="timezero",
        reward_funcs=["iou", "format"], loss_type="dapo", freeze_vision_tower=True, use_peft=True,
        train_file="data/charades_sta/train.jsonl"),
    "qwen3_vl_8b_charades_timelens.yaml": dict(
        size=SIZE_8B, vision=QWEN3_VISION_PARAMS, num_generations=8, beta=0.0, epsilon=0.2, learning_rate=1e-6,
        max_completion_length=256, video_fps=2.0, video_total_pixels=TIMELENS_PIXELS, video_min_pixels=64 * 32 * 32,
        prompt_template="timelens", reward_funcs=["tiou"], loss_type="dapo", freeze_vision_tower=True,
        use_peft=False, train_file="data/charades_sta/train.jsonl", longest=14336),
    "qwen3_vl_8b_lora_48gb.yaml": dict(
        size=SIZE_8B, vision=QWEN3_VISION_PARAMS, num_generations=8, beta=0.0, epsilon=0.2, learning_rate=1e-5,
        max_completion_length=256, video_fps=2.0, video_total_pixels=4096 * 32 * 32, video_min_pixels=64 * 32 * 32,
        prompt_template="timelens", reward_funcs=["tiou"], loss_type="dapo", freeze_vision_tower=True,
        use_peft=True, train_file="data/charades_sta/train.jsonl", longest=4096),
    "qwen3_vl_8b_timelens2.yaml": dict(
        size=SIZE_8B, vision=QWEN3_VISION_PARAMS, num_generations=8, beta=0.04, epsilon=0.2, learning_rate=1e-6,
        max_completion_length=512, video_fps=2.0, video_total_pixels=TIMELENS2_PIXELS, video_min_pixels=32 * 32,
        prompt_template="timelens2", reward_funcs=["twass1", "set_iou", "parse_penalty"], loss_type="bnpo",
        freeze_vision_tower=True, use_peft=False, train_file="data/timelens2/train.jsonl", longest=16384),
    # no ../shared/models/Qwen3-VL-4B-Instruct: its size is checked in tests/test_fits.py on its config.json (a
    # fixture); its prompts are sized with the 8B's processor (the Qwen3-VL family's one preprocessing)
    "qwen3_vl_4b_timelens2.yaml": dict(
        size=None, processor="Qwen3-VL-8B-Instruct", num_generations=8, beta=0.04, epsilon=0.2, learning_rate=1e-6,
        max_completion_length=512, video_fps=2.0, video_total_pixels=TIMELENS2_PIXELS, video_min_pixels=32 * 32,
        prompt_template="timelens2", reward_funcs=["twass1", "set_iou", "parse_penalty"], loss_type="bnpo",
        freeze_vision_tower=True, use_peft=False, train_file="data/timelens2/train.jsonl", longest=16384),
}


def _hub_recipes() -> list[str]:
    """Config files in configs/ whose model is a hub id ``Qwen/<name>`` (the GPU recipes of ``train``; the distillation
    recipes, which name a teacher, are checked in tests/test_distill.py)."""
    names = []
    for path in sorted(CONFIGS.glob("*.yaml")):
        data = yaml.safe_load(path.read_text()) or {}
        if str(data.get("model_name_or_path", "")).startswith("Qwen/") and "teacher_model_name_or_path" not in data:
            names.append(path.name)
    return names


@functools.lru_cache(maxsize=None)
def _parse(name: str):
    """(script_args, GroundingGRPOConfig, ModelConfig) from the training parser, as ``grounding-rl train`` reads them.

    bf16 needs a GPU unless ``use_cpu`` is set (TrainingArguments refuses it otherwise), so on a CPU-only machine the
    one override ``--use_cpu true`` is added, as a user would on the command line. Cached: tests only read it.
    """
    from grounding_rl.cli.common import parse_training_args
    from grounding_rl.update.config import GroundingGRPOConfig

    argv = ["--config", f"configs/{name}"]
    if not torch.cuda.is_available():
        argv += ["--use_cpu", "true"]
    return parse_training_args(GroundingGRPOConfig, argv, "grounding-rl train")


def _meta_model(shared: Path, hub_id: str):
    """The hub id's model class (from its config.json) at its size on the meta device (config only, no weights)."""
    from transformers import AutoConfig, AutoModelForImageTextToText

    org, name = hub_id.split("/", 1)
    assert org == "Qwen", hub_id
    config_dir = shared / "models" / name
    assert (config_dir / "config.json").is_file(), f"no ../shared/models/{name}/config.json for {hub_id}"
    config = AutoConfig.from_pretrained(config_dir)
    with torch.device("meta"):
        return AutoModelForImageTextToText.from_config(config)


def test_every_hub_recipe_is_known():
    """The recipes exist, and a new Qwen recipe must be added to EXPECTED (so its values get checked)."""
    assert sorted(_hub_recipes()) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_recipe_parses_with_promised_values(name):
    script_args, args, model_args = _parse(name)
    want = EXPECTED[name]
    for key in ("num_generations", "beta", "epsilon", "learning_rate", "max_completion_length", "video_fps",
                "video_total_pixels", "video_min_pixels", "prompt_template", "reward_funcs", "loss_type"):
        got, expected = getattr(args, key), want[key]
        if isinstance(expected, float):
            assert got == pytest.approx(expected), (name, key, got)
        else:
            assert got == expected, (name, key, got)
    assert args.bf16 is True and args.gradient_checkpointing is True and args.activation_checkpointing is True, name
    assert args.temperature == 1.0
    assert model_args.dtype == "bfloat16"
    assert model_args.use_peft is want["use_peft"]
    assert script_args.freeze_vision_tower is want["freeze_vision_tower"]
    # the data file need not exist to parse; it resolves against the repository root
    assert script_args.train_file == str(REPO_ROOT / want["train_file"])
    assert script_args.video_root is None
    # what every checkpoint will carry for evaluation
    saved = args.grounding_config()
    assert saved.prompt_template == want["prompt_template"] and saved.video.total_pixels == want["video_total_pixels"]


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_generation_batch_holds_whole_groups_on_any_gpu_count(name):
    """TRL's rule: per_device_train_batch_size × processes × steps_per_generation must be a multiple of G."""
    _, args, _ = _parse(name)
    steps = args.steps_per_generation
    assert steps == args.gradient_accumulation_steps
    for processes in (1, 2, 4, 8, 16, 32):
        assert args.per_device_train_batch_size * processes * steps % args.num_generations == 0, (name, processes)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_longest_prompt_fits_max_prompt_length(name, shared):
    """Video tokens for clips of 1 s to 20 min at common aspect ratios, plus a generous 300 text tokens, never exceed
    max_prompt_length (which is an error, not a truncation, in training)."""
    from grounding_rl.data.video import frame_size, num_sampled_frames
    from grounding_rl.family import family_of_checkpoint

    _, args, model_args = _parse(name)
    name_of = EXPECTED[name].get("processor", model_args.model_name_or_path.split("/", 1)[1])
    family = family_of_checkpoint(shared / "models" / name_of)
    settings = family.video_settings(args.video_settings)
    factor = settings.pixel_factor
    longest = stamps = 0
    for seconds in (1, 5, 10, 30, 60, 120, 200, 300, 384, 400, 600, 1200):
        frames = num_sampled_frames(settings, int(seconds * 30), 30.0)
        for height, width in ((360, 480), (360, 640), (480, 640), (1080, 1920), (1920, 1080), (480, 480)):
            h, w = frame_size(height, width, frames, settings)
            longest = max(longest, (frames // 2) * (h // factor) * (w // factor))
        if family.name == "qwen3_vl":  # "<1234.5 seconds>" ≤ 7 tokens and a vision start/end pair per frame pair
            stamps = max(stamps, (frames // 2) * 9)
    assert longest + stamps + 300 <= args.max_prompt_length, (name, longest, stamps)
    if "longest" in EXPECTED[name]:
        assert longest == EXPECTED[name]["longest"], (name, longest)
    elif settings.total_pixels == TIMEZERO_PIXELS:
        assert longest == 6144  # 768 frames at the 16·28·28 floor: 384 × 4 × 4 (square), 5,760 at 16:9
    else:
        assert longest == 1024  # the LoRA recipe: 128 frames


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_recipe_model_size_on_meta_device(name, shared):
    if EXPECTED[name]["size"] is None:
        pytest.skip(f"{name}: its model's config.json is not in ../shared/models")
    _, args, model_args = _parse(name)
    model = _meta_model(shared, model_args.model_name_or_path)
    total = sum(p.numel() for p in model.parameters())
    low, high = EXPECTED[name]["size"]
    assert low <= total <= high, (name, total)
    vision = sum(p.numel() for p in model.model.visual.parameters())
    low, high = EXPECTED[name].get("vision", VISION_PARAMS)
    assert low <= vision <= high, (name, vision)
    assert all(p.device.type == "meta" for p in model.parameters())


def test_time_r1_recipe_freezes_the_whole_vision_tower(shared):
    from grounding_rl.models.loading import freeze_vision_tower

    script_args, _, model_args = _parse("qwen2_5_vl_3b_charades_time_r1.yaml")
    assert script_args.freeze_vision_tower
    model = _meta_model(shared, model_args.model_name_or_path)
    frozen = freeze_vision_tower(model)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert frozen == 668_684_288
    assert trainable == 3_754_622_976 - 668_684_288


def test_lora_recipe_targets_only_the_language_model(shared):
    """The LoRA regex matches the 7 projections of each of the 36 LLM layers and nothing in the vision tower; the
    adapter size is the 29.9e6 the memory comment counts."""
    from peft.tuners.tuners_utils import check_target_module_exists
    from trl import get_peft_config

    _, _, model_args = _parse("qwen2_5_vl_3b_lora_24gb.yaml")
    lora = get_peft_config(model_args)
    assert lora is not None and lora.r == 16 and lora.lora_alpha == 32
    assert isinstance(lora.target_modules, str)  # a single entry is a regex for PEFT
    model = _meta_model(shared, model_args.model_name_or_path)
    matched = [(n, m) for n, m in model.named_modules() if check_target_module_exists(lora, n)]
    assert len(matched) == 36 * 7
    assert not [n for n, _ in matched if "visual" in n]
    assert {re.sub(r"\.\d+\.", ".N.", n) for n, _ in matched} == {
        f"model.language_model.layers.N.{p}" for p in
        ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
         "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")}
    adapter = sum(lora.r * (m.in_features + m.out_features) for _, m in matched)
    assert adapter == 29_933_568
    # the memory estimate in the recipe: bf16 weights + fp32 adapter/grad/Adam stay well under 24 GB
    weights = sum(p.numel() for p in model.parameters()) * 2
    assert weights + adapter * 16 < 8.5e9


def test_qwen3_lora_recipe_targets_only_the_language_model(shared):
    """Qwen3-VL-8B: the LoRA regex matches the 7 projections of each of the 36 LLM layers and nothing in the vision
    tower; the adapter is the 43.6e6 parameters its memory comment counts."""
    from peft.tuners.tuners_utils import check_target_module_exists
    from trl import get_peft_config

    _, _, model_args = _parse("qwen3_vl_8b_lora_48gb.yaml")
    lora = get_peft_config(model_args)
    model = _meta_model(shared, model_args.model_name_or_path)
    assert len(model.model.visual.deepstack_merger_list) == 3  # DeepStack: vision blocks 8, 16, 24
    matched = [(n, m) for n, m in model.named_modules() if check_target_module_exists(lora, n)]
    assert len(matched) == 36 * 7 and not [n for n, _ in matched if "visual" in n]
    adapter = sum(lora.r * (m.in_features + m.out_features) for _, m in matched)
    assert adapter == 43_646_976


@pytest.mark.parametrize("name", ["qwen3_vl_4b_timelens2.yaml", "qwen3_vl_8b_timelens2.yaml"])
def test_timelens2_recipes_hold_its_sampling_and_batch(name):
    """TimeLens2's grpo/scripts/train_grpo_{4b,8b}.sh: dispersion weights p_std 0, p_mean 2 on tiou (set_iou), 64
    completions a step on 8 GPUs as 1 per micro-step × 8 accumulation steps, constant lr, max_grad_norm 1, seed 42,
    2 fps and ≤ 512 frames, the plain k3 KL; 300 steps for the 8B, 200 for the 4B."""
    _, args, _ = _parse(name)
    own = args.recipe_args["difficulty_selection"]
    assert (own.difficulty_sampling, own.difficulty_p_std, own.difficulty_p_mean, own.difficulty_mean_reward) == (
        "dispersion", 0.0, 2.0, "set_iou")
    assert args.per_device_train_batch_size * 8 * args.gradient_accumulation_steps == 64
    assert args.lr_scheduler_type == "constant" and args.max_grad_norm == 1.0 and args.seed == 42
    assert args.video_max_frames == 512 and args.scale_rewards == "none" and args.use_bias_correction_kl is False
    assert args.max_steps == (300 if "8b" in name else 200) and args.top_p == 1.0


@pytest.mark.slow
def test_timelens2_recipe_runs_two_steps_with_a_tiny_model(tmp_path, shared, tiny_qwen3_model_dir, capsys):
    """The 8B TimeLens2 YAML itself, two GRPO steps on CPU with a tiny Qwen3-VL (``--model_name_or_path``; plus
    ``--use_cpu``/``--bf16 false`` for the CPU, the data and output paths, and ``--max_completion_length 32``: with
    the recipe's 512 the run took over 25 minutes on a shared 2-core CPU, the full-vocabulary logits of 512 tokens
    dominating): TimeLens2-format rollout rows of ../shared's clips with both sources' baked prompts, prepared,
    dispersion-weighted and trained on, 1 completion per micro-step × 8 accumulation steps."""
    from grounding_rl.cli import main as cli
    from grounding_rl.prompts.templates import TEMPLATES

    clips = [c for c in map(json.loads, (shared / "data" / "videos" / "annotations.jsonl").read_text().splitlines())
             if c["duration"] < 11][:6]  # the 10 s clips: short prompts on a CPU
    rows = [{"video_path": c["video"], "duration": c["duration"], "span": [[c["start"], c["end"]]],
             "query": TEMPLATES["timelens2" if k % 2 else "timelens_100k"].replace("[EVENT]", c["query"]),
             "rollouts": [f"[[{c['start'] + j}, {c['end']}]]" for j in range(8)] if k != 5 else None}
            for k, c in enumerate(clips)]
    source, train = tmp_path / "rollouts.jsonl", tmp_path / "train.jsonl"
    source.write_text("".join(json.dumps({k: v for k, v in r.items() if v is not None}) + "\n" for r in rows))
    assert cli(["prepare", "--format", "timelens2", "--annotations", str(source), "--video-root",
                str(shared / "data" / "videos"), "--out", str(train)]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["with_rollouts"] == 5
    out = tmp_path / "run"
    assert cli(["train", "--config", str(CONFIGS / "qwen3_vl_8b_timelens2.yaml"), "--model_name_or_path",
                str(tiny_qwen3_model_dir), "--train_file", str(train), "--output_dir", str(out), "--max_steps", "2",
                "--use_cpu", "true", "--bf16", "false", "--dataloader_num_workers", "0", "--save_strategy", "no",
                "--max_completion_length", "32"]) == 0
    state = json.loads((out / "trainer_state.json").read_text())
    assert state["global_step"] == 2
    saved = json.loads((out / "grounding_config.json").read_text())
    assert saved["reward_funcs"] == ["twass1", "set_iou", "parse_penalty"] and saved["video"]["fps"] == 2.0
    assert {m["prompt_template"]: m["rows"] for m in saved["data_mix"]} == {"timelens2": 3, "timelens_100k": 3}
    assert saved["duration_filter"] == {"min_video_duration": 3.0, "max_video_duration": 3600.0, "samples": 6,
                                        "dropped": 0}  # the 6-10.4 s clips all pass TimeLens2's 3-3,600 s filter
