"""Per-GPU memory of the recipes in configs/ (grounding_rl.dev.memory, ``grounding-rl fits``): the real model sizes
built on the meta device from ../shared/models, model states equal to DeepSpeed's own estimators, the activation
rule on hand-computed numbers, and the command's table and JSON."""
from __future__ import annotations

import functools
import json

import pytest
import torch

from grounding_rl.dev import memory
from grounding_rl.paths import REPO_ROOT

torch.set_num_threads(1)

ACCELERATE = REPO_ROOT / "configs" / "accelerate"
STRATEGIES = sorted(ACCELERATE.glob("*.yaml"))
P_7B, LARGEST_7B = 8_292_166_656, 544_997_376  # all parameters; the embedding (152,064 × 3,584)
P_3B, LARGEST_3B, VISION_3B = 3_754_622_976, 311_164_928, 668_684_288  # embedding 151,936 × 2,048 (tied)
LORA_3B = 29_933_568  # r 16 on the 7 projections of the 36 layers (tests/test_recipes.py)


@functools.lru_cache(maxsize=None)
def _report(recipe: str, gpus: int, model: str | None = None) -> dict:
    from grounding_rl.cli.fits import estimate_recipe

    return estimate_recipe(f"configs/{recipe}", gpus, STRATEGIES, model)


def _row(report, name):
    (row,) = [r for r in report["strategies"] if r["name"] == name]
    return row


def test_strategies_read_from_the_accelerate_configs():
    got = {p.stem: memory.strategy_from_accelerate_config(p) for p in STRATEGIES}
    assert got == {
        "ddp": memory.Strategy("ddp", 0),
        "zero1": memory.Strategy("zero1", 1),
        "zero2": memory.Strategy("zero2", 2),
        "zero3": memory.Strategy("zero3", 3),
        "zero3_offload": memory.Strategy("zero3_offload", 3, offload_optimizer=True, offload_param=True)}


def test_zero_stage_zero_is_refused(tmp_path):
    (tmp_path / "z0.json").write_text(json.dumps({"zero_optimization": {"stage": 0}}))
    (tmp_path / "z0.yaml").write_text(f"distributed_type: DEEPSPEED\ndeepspeed_config:\n"
                                      f"  deepspeed_config_file: {tmp_path / 'z0.json'}\n")
    with pytest.raises(ValueError, match="ZeRO stage 0"):
        memory.strategy_from_accelerate_config(tmp_path / "z0.yaml")


def test_7b_timezero_model_states_equal_deepspeeds_estimators(shared):
    """Every parameter trains: weights + gradients + optimizer = DeepSpeed's numbers, to the byte."""
    report = _report("qwen2_5_vl_7b_charades_timezero.yaml", 8)
    assert report["shape"]["total_params"] == P_7B and report["shape"]["largest_layer_params"] == LARGEST_7B
    zero3 = _row(report, "zero3")
    assert zero3["bytes"]["model_states"] == zero3["deepspeed_model_states"] == 4 * LARGEST_7B + 18 * P_7B // 8
    assert zero3["bytes"]["weights"] == 4 * LARGEST_7B + 2 * P_7B // 8
    assert zero3["bytes"]["reference"] == 2 * P_7B // 8  # beta 0.04: a partitioned reference copy
    zero2 = _row(report, "zero2")
    assert zero2["bytes"]["model_states"] == zero2["deepspeed_model_states"] == 2 * P_7B + 18 * P_7B // 8
    assert zero2["bytes"]["reference"] == 2 * P_7B  # replicated (stage 0) under ZeRO-2
    # ZeRO-1: the 16-bit gradients whole on every GPU, the fp32 states partitioned (DeepSpeed's estimator, shared
    # by stages 1 and 2, is the ZeRO-2 number)
    zero1 = _row(report, "zero1")
    assert zero1["bytes"]["model_states"] == 2 * P_7B + 2 * P_7B + 16 * P_7B // 8
    assert zero1["deepspeed_model_states"] == zero2["deepspeed_model_states"]
    offload = _row(report, "zero3_offload")
    assert offload["bytes"]["model_states"] == offload["deepspeed_model_states"] == 4 * LARGEST_7B
    ddp = _row(report, "ddp")
    assert ddp["deepspeed_model_states"] is None
    assert (ddp["bytes"]["weights"], ddp["bytes"]["gradients"], ddp["bytes"]["optimizer"]) == (
        2 * P_7B, 2 * P_7B, 4 * P_7B)  # bf16 weights, bf16 AdamW moments
    # the same activations under every strategy, the larger of training and generation
    assert len({r["bytes"]["activations"] for r in report["strategies"]}) == 1
    b = zero3["bytes"]
    assert b["activations"] == max(b["training_activations"], b["generation_activations"]) > 0
    assert b["total"] == b["model_states"] + b["reference"] + b["activations"] + memory.CUDA_OVERHEAD


def test_time_r1_frozen_vision_tower_trains_no_vision_states(shared):
    report = _report("qwen2_5_vl_3b_charades_time_r1.yaml", 4)
    trainable = P_3B - VISION_3B
    assert report["shape"]["trainable_params"] == trainable
    zero3 = _row(report, "zero3")["bytes"]
    assert zero3["weights"] == 4 * LARGEST_3B + 2 * P_3B // 4  # frozen weights are still partitioned
    assert (zero3["gradients"], zero3["optimizer"], zero3["reference"]) == (4 * trainable // 4, 12 * trainable // 4, 0)
    assert report["workload"]["freeze_vision"] and report["workload"]["beta"] == 0.0


def test_lora_recipe_fits_one_24_gb_gpu(shared):
    """The recipe's own budget: bf16 base, fp32 adapter with its gradient and Adam moments, no reference copy."""
    report = _report("qwen2_5_vl_3b_lora_24gb.yaml", 1)
    assert report["shape"]["lora_params"] == report["shape"]["trainable_params"] == LORA_3B
    ddp = _row(report, "ddp")["bytes"]
    assert (ddp["weights"], ddp["gradients"], ddp["optimizer"], ddp["reference"]) == (
        2 * P_3B + 4 * LORA_3B, 4 * LORA_3B, 8 * LORA_3B, 0)
    assert ddp["total"] < 24 * 2**30
    assert report["workload"]["video_tokens"] <= 1024  # 1024·28·28 pixels


def test_qwen3_vl_8b_builds_on_meta_with_the_recipe_settings(shared):
    report = _report("qwen2_5_vl_7b_charades_timezero.yaml", 8, "Qwen/Qwen3-VL-8B-Instruct")
    assert report["shape"]["total_params"] == 8_767_123_696
    assert report["shape"]["vision_params"] == 576_388_336
    zero3 = _row(report, "zero3")
    assert zero3["bytes"]["model_states"] == zero3["deepspeed_model_states"]


def test_activation_rule_on_hand_computed_numbers():
    shape = memory.ModelShape(total_params=0, vision_params=0, largest_layer_params=0, trainable_params=0,
                              lora_params=0, layers=2, hidden=4, intermediate=8, kv_width=2, vocab=10,
                              vision_depth=1, vision_hidden=2, vision_intermediate=4, merge=2)
    work = memory.Workload(rows=2, generation_rows=4, num_generations=2, video_tokens=3, completion_tokens=5)
    assert work.sequence_tokens == 308
    assert memory.layer_token_bytes(4, 8, 2, 2) == 112  # 2 · (20 + 32 + 4)
    training, generation = memory.activation_bytes(shape, work)
    # text: 2 layers · 616 tokens · 4 · 2 B + 2 · 616 · 112 = 147,840; logits 2·2·5·10·2 + 2·5·10·4 = 800;
    # vision: 1 clip · 3 tokens · 4 patches = 12 patches; 1 · 12 · 2 · 2 + 2 · 12 · 60 = 1,488
    assert training == 147_840 + 800 + 1_488
    # KV cache 4 rows · 308 · 2 · 2 layers · 2 · 2 B = 19,712; prefill 2 clips · 303 · 112 = 67,872 (> encode 1,440)
    assert generation == 19_712 + 67_872
    frozen, _ = memory.activation_bytes(shape, memory.Workload(**{**work.__dict__, "freeze_vision": True}))
    assert frozen == 147_840 + 800 + 12 * 60
    unshared, _ = memory.activation_bytes(shape, memory.Workload(**{**work.__dict__, "share_video_encoding": False}))
    assert unshared == 147_840 + 800 + 2 * 1_488  # one encoding per row


def test_fits_command_table_and_json(shared, capsys):
    from grounding_rl.cli import main

    assert main(["fits", "configs/qwen2_5_vl_7b_charades_timezero.yaml", "--gpus", "8", "--gpu-memory", "80",
                 "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    fits = {row["name"]: row["fits"] for row in report["strategies"]}
    assert fits == {"ddp": False, "zero1": False, "zero2": True, "zero3": True, "zero3_offload": True}
    assert main(["fits", "configs/qwen2_5_vl_7b_charades_timezero.yaml", "--gpus", "8", "--accelerate-config",
                 str(ACCELERATE / "zero3.yaml")]) == 0
    out = capsys.readouterr().out
    assert "zero3" in out and "ddp" not in out and "DeepSpeed's estimators" in out
    assert "offload_param=none, offload_optimizer=none, zero_init=1" in out  # DeepSpeed's own table


def test_fits_command_user_errors(shared, capsys):
    from grounding_rl.cli import main

    assert main(["fits", "configs/qwen2_5_vl_3b_lora_24gb.yaml", "--gpus", "3", "--nodes", "2"]) == 2
    assert "multiple of --nodes" in capsys.readouterr().err
    assert main(["fits", "configs/qwen2_5_vl_3b_lora_24gb.yaml", "--accelerate-config", "nope.yaml"]) == 2
    assert "no such accelerate config" in capsys.readouterr().err


def test_a_recipe_is_read_as_train_else_as_distill(shared, tmp_path):
    """parse_recipe: the config train accepts, else distill's. The 7B → 3B recipe (a teacher, no distillation_weight)
    is distill's; with distillation_weight 0.5 it is GRPO plus the teacher term; one both refuse gets train's message."""
    from grounding_rl.cli.fits import parse_recipe
    from grounding_rl.errors import UserError
    from grounding_rl.update.recipes import teacher

    distill = REPO_ROOT / "configs" / "qwen2_5_vl_7b_to_3b_distill.yaml"
    (tmp_path / "grpo.yaml").write_text(distill.read_text() + "distillation_weight: 0.5\n")
    (tmp_path / "bad.yaml").write_text(distill.read_text().replace("beta: 1.0", "beta: 2.0"))
    parsed = [parse_recipe(str(path))[1] for path in (distill, tmp_path / "grpo.yaml")]
    assert [(args.stage, teacher(args)[1:]) for args in parsed] == [("distill", ("beta", 1.0)),
                                                                   ("train", ("distillation_beta", 1.0))]
    with pytest.raises(UserError, match="teacher_model_name_or_path is set but distillation_weight is 0"):
        parse_recipe(str(tmp_path / "bad.yaml"))


def test_qwen3_vl_4b_timelens2_recipe_fits_8_gpus_of_80_gb():
    """TimeLens2's 4B recipe on Qwen3-VL-4B-Instruct's config (tests/fixtures/qwen3_vl_4b_instruct/config.json: the
    hub file's dimensions, from two public copies that agree; ../shared has no 4B). Text: tied embedding 151,936 ·
    2,560 = 388,956,160, 36 layers of 26,214,400 attention + 256 q/k norms + 74,711,040 MLP + 5,120 norms
    = 100,930,816, final norm 2,560: 4,022,468,096 — all trainable with the vision tower (415,347,712) frozen."""
    report = _report("qwen3_vl_4b_timelens2.yaml", 8, str(REPO_ROOT / "tests/fixtures/qwen3_vl_4b_instruct"))
    shape = report["shape"]
    assert shape["trainable_params"] == 388_956_160 + 36 * 100_930_816 + 2_560 == 4_022_468_096
    assert shape["total_params"] == 4_022_468_096 + 415_347_712 == shape["trainable_params"] + shape["vision_params"]
    zero1 = _row(report, "zero1")
    assert round(zero1["bytes"]["total"] / 2**30, 2) == 46.10  # fits 80 GiB, as does DDP (53.59)
    assert round(_row(report, "ddp")["bytes"]["total"] / 2**30, 2) == 53.59
