"""``grounding-rl fits CONFIG --gpus N --gpu-memory 80``: does a GRPO recipe fit these GPUs? Per-GPU memory under
each launch strategy, before launching.

The recipe's model is built on the ``meta`` device from its config.json (a local folder, ``../shared/models/<name>``
for a ``Qwen/<name>`` hub id, else the hub's config.json alone; no weights). Per strategy — each accelerate config in
``configs/accelerate/`` unless ``--accelerate-config`` names one — it prints weights, gradients, optimizer states,
the reference model, an activations estimate and the total, with DeepSpeed's own model-state estimate beside it and
DeepSpeed's tables (``estimate_zero2_model_states_mem_needs_all_cold`` / ``estimate_zero3_..._all_cold``) below.
The rules are in :mod:`grounding_rl.dev.memory`. Memory is in GiB (2**30 bytes), as ``nvidia-smi`` reports MiB.

The video length sets the prompt: a ``--video-seconds`` clip of ``--frame-size`` at the recipe's fps and pixel budget
(its merged tokens, plus for Qwen3-VL the ``<t seconds>`` text before each pair of frames), or ``--video-tokens N``
merged tokens (a 16k-token video prompt: ``--video-tokens 16384 --video-seconds 3600``; the timestamps still follow
the frames the recipe takes of ``--video-seconds``). A prompt longer than the recipe's ``max_prompt_length`` is
estimated as asked and flagged (training would refuse it: raise ``max_prompt_length``). ``--model`` swaps the recipe's
model (e.g. ``Qwen/Qwen3-VL-8B-Instruct``). ``--json`` prints one JSON object instead of the table.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
from pathlib import Path

from grounding_rl.errors import UserError, check_number
from grounding_rl.paths import REPO_ROOT, shared_dir

GIB = 2**30


def _frame_size(text: str) -> tuple[int, int]:
    try:
        height, width = (int(v) for v in text.lower().split("x"))
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"{text!r} is not HEIGHTxWIDTH (e.g. 480x640)") from err
    return height, width


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="grounding-rl fits", description=(
        "Does a GRPO or distillation recipe fit these GPUs? Per-GPU memory under each launch strategy "
        "(weights, gradients, optimizer states, reference model, teacher, activations), from the model's config.json "
        "on the meta device, before launching; memory in GiB."))
    parser.add_argument("config", help="a training recipe (YAML), e.g. configs/qwen2_5_vl_7b_charades_timezero.yaml")
    parser.add_argument("--gpus", type=int, default=1, help="GPUs in all (processes)")
    parser.add_argument("--nodes", type=int, default=1, help="machines the GPUs are spread over")
    parser.add_argument("--gpu-memory", type=float, default=80.0, help="memory of one GPU, GiB")
    parser.add_argument("--accelerate-config", action="append", default=None,
                        help="an accelerate YAML (repeatable; default: every configs/accelerate/*.yaml)")
    parser.add_argument("--model", default=None, help="estimate another model with the recipe's settings")
    parser.add_argument("--video-seconds", type=float, default=30.0, help="clip length setting the prompt (s)")
    parser.add_argument("--frame-size", type=_frame_size, default=(480, 640), help="source frame HEIGHTxWIDTH")
    parser.add_argument("--video-tokens", type=int, default=None,
                        help="merged video tokens of the prompt (default: what the recipe takes of the clip)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    return parser


def parse_recipe(config: str):
    """``(script_args, training_args, model_args)`` of a recipe as ``grounding-rl train`` parses it, else as
    ``grounding-rl distill`` does (UserError with train's message when both refuse it); with ``use_cpu`` so a bf16
    recipe parses on a machine without a GPU (nothing here runs on a device)."""
    from grounding_rl.cli.common import parse_training_args
    from grounding_rl.update.config import GroundingGRPOConfig
    from grounding_rl.update.distill_config import DistillationConfig

    argv = ["--config", config, "--use_cpu", "true", "--report_to", "none"]
    try:
        return parse_training_args(GroundingGRPOConfig, argv, "grounding-rl fits")
    except UserError as refused:
        try:
            return parse_training_args(DistillationConfig, argv, "grounding-rl distill")
        except UserError:
            raise refused from None


def video_prompt(settings, seconds: float, frame_size: tuple[int, int], token_pixels: int, family=None) -> dict:
    """A clip's share of the prompt: T frames and their rate f (:func:`grounding_rl.data.video.sampling_plan`: fps,
    min/max frames, the budget rule) at the per-frame size of qwen-vl-utils, T/2 temporal groups of ``H·W /
    token_pixels²`` merged tokens (28 for Qwen2.5-VL: patch 14 × merge 2; 32 for Qwen3-VL), and the text tokens
    ``family`` writes to time them (:meth:`grounding_rl.family.Family.time_text_tokens`).

    Returns:
        ``{"frames", "fps", "height", "width", "video_tokens", "time_tokens"}``.
    """
    import numpy as np

    from grounding_rl.data.video import frame_size as size_of, sampling_plan

    frames, f = sampling_plan(settings, seconds)
    height, width = size_of(*frame_size, frames, settings)
    time_tokens = family.time_text_tokens(np.arange(frames) / f) if family is not None else 0
    return {"frames": frames, "fps": f, "height": height, "width": width,
            "video_tokens": (frames // 2) * round(height * width / token_pixels**2), "time_tokens": time_tokens}


def _workload(script_args, args, model_args, video: dict, teacher: dict):
    """The :class:`grounding_rl.dev.memory.Workload` of a parsed recipe (:func:`parse_recipe`) with ``video``
    (:func:`video_prompt`) and ``teacher`` (``{"teacher_params", "teacher_vocab"}`` or empty)."""
    from grounding_rl.dev import memory

    return memory.Workload(
        rows=args.per_device_train_batch_size,
        generation_rows=args.per_device_train_batch_size * args.steps_per_generation,
        num_generations=args.num_generations,
        video_tokens=video["video_tokens"], time_tokens=video["time_tokens"],
        completion_tokens=args.max_completion_length, beta=0.0 if args.stage == "distill" else args.beta,  # KL's
        dtype_bytes=4 if model_args.dtype in ("float32", None) and not args.bf16 else 2,
        checkpointing=bool(args.gradient_checkpointing), use_peft=bool(model_args.use_peft),
        freeze_vision=bool(script_args.freeze_vision_tower), share_video_encoding=bool(args.share_video_encoding),
        **teacher)


def estimate_recipe(config: str, gpus: int, accelerate_configs: list[Path], model: str | None = None,
                    video_seconds: float = 30.0, frame_size: tuple[int, int] = (480, 640), nodes: int = 1,
                    video_tokens: int | None = None) -> dict:
    """Per-GPU memory of a recipe under each accelerate config: ``{"recipe", "model", "shape", "workload", "video",
    "max_prompt_length", "prompt_refused", "strategies": [{"name", "zero_stage", ..., "bytes": {...},
    "deepspeed_model_states"}]}``. ``video_tokens`` replaces the merged tokens the recipe takes of the clip.

    Raises:
        UserError: the model's config cannot be found, or an accelerate config cannot be read.
    """
    from dataclasses import asdict

    from grounding_rl.dev import memory

    script_args, args, model_args = parse_recipe(config)
    name = model or model_args.model_name_or_path
    try:
        model_config = memory.model_config(name, shared_dir())
    except OSError as err:
        raise UserError(f"{name}: no config.json found (a local folder, ../shared/models/<name> or the hub): "
                        f"{err}") from err
    meta = memory.meta_model(model_config)
    peft_config = None
    if model_args.use_peft:
        from trl import get_peft_config

        peft_config = get_peft_config(model_args)
    shape = memory.model_shape(meta, freeze_vision=script_args.freeze_vision_tower, peft_config=peft_config)
    vision = model_config.vision_config
    token_pixels = vision.patch_size * vision.spatial_merge_size
    from grounding_rl.family import family_of

    family = family_of(model_config)
    settings = family.video_settings(args.video_settings)
    video = video_prompt(settings, video_seconds, frame_size, token_pixels, family)
    from grounding_rl.update.recipes import teacher as teacher_of

    teacher, pair = {}, teacher_of(args)
    if pair:  # a distillation teacher, frozen in the same processes
        teacher_config = memory.model_config(pair[0], shared_dir())
        teacher_shape = memory.model_shape(memory.meta_model(teacher_config))
        teacher = {"teacher_params": teacher_shape.total_params, "teacher_vocab": teacher_shape.vocab}
    if video_tokens is not None:
        video["video_tokens"] = video_tokens
    work = _workload(script_args, args, model_args, video, teacher)
    rows = []
    for path in accelerate_configs:
        try:
            strategy = memory.strategy_from_accelerate_config(path)
        except (OSError, ValueError) as err:
            raise UserError(f"{path}: {err}") from err
        result = memory.estimate(shape, work, strategy, gpus)
        rows.append({**asdict(strategy), "bytes": {**asdict(result), "model_states": result.model_states},
                     "deepspeed_model_states": memory.deepspeed_model_states(shape, strategy, gpus, nodes)})
    return {"recipe": config, "model": name, "gpus": gpus, "nodes": nodes, "shape": asdict(shape),
            "workload": {**asdict(work), "prompt_tokens": work.prompt_tokens, "sequence_tokens": work.sequence_tokens},
            "video": video, "max_prompt_length": args.max_prompt_length,
            "teacher": {"model": pair[0], pair[1]: pair[2]} if pair else None,  # its β under its field's name
            "prompt_refused": bool(args.max_prompt_length) and work.prompt_tokens > args.max_prompt_length,
            "strategies": rows}


def _deepspeed_tables(shape: dict, stages: set[int], gpus: int, nodes: int) -> str:
    """DeepSpeed's own printed tables (every parameter trainable), captured."""
    out = io.StringIO()
    per_node = max(gpus // nodes, 1)
    with contextlib.redirect_stdout(out):
        if stages & {1, 2}:
            from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs_all_cold

            estimate_zero2_model_states_mem_needs_all_cold(shape["total_params"], per_node, nodes)
        if 3 in stages:
            from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs_all_cold

            estimate_zero3_model_states_mem_needs_all_cold(shape["total_params"], shape["largest_layer_params"],
                                                           per_node, nodes)
    return out.getvalue()


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.gpus < 1 or args.nodes < 1 or args.gpus % args.nodes:
        raise UserError(f"--gpus {args.gpus} must be a positive multiple of --nodes {args.nodes}")
    check_number("--gpu-memory", args.gpu_memory, above=0)
    check_number("--video-seconds", args.video_seconds, above=0)
    check_number("--video-tokens", args.video_tokens, minimum=1)
    if min(args.frame_size) < 1:
        raise UserError(f"--frame-size must be positive (got {args.frame_size[0]}x{args.frame_size[1]})")
    configs = [Path(p) for p in args.accelerate_config] if args.accelerate_config else sorted(
        (REPO_ROOT / "configs" / "accelerate").glob("*.yaml"))
    for path in configs:
        if not path.is_file():
            raise UserError(f"{path}: no such accelerate config")
    report = estimate_recipe(args.config, args.gpus, configs, args.model, args.video_seconds, args.frame_size,
                             args.nodes, args.video_tokens)
    budget = args.gpu_memory * GIB
    for row in report["strategies"]:
        row["fits"] = row["bytes"]["total"] <= budget
    if args.json:
        print(json.dumps({**report, "gpu_memory_gib": args.gpu_memory}))
        return 0
    _print_report(report, args)
    return 0


def _print_report(report: dict, args: argparse.Namespace) -> None:
    """The table ``fits`` prints without ``--json``: the recipe's shape and workload, the sequence, then per strategy
    the per-GPU memory in GiB and whether it fits, and DeepSpeed's own tables."""
    shape, work = report["shape"], report["workload"]
    teacher_note = (f", teacher {work['teacher_params'] / 1e9:.2f}e9 parameters (divergence "
                    "{} {})".format(*list(report["teacher"].items())[1]) if work["teacher_params"] else "")
    print(f"{report['recipe']}: {report['model']}, {shape['total_params'] / 1e9:.2f}e9 parameters "
          f"({shape['vision_params'] / 1e9:.2f}e9 vision), {shape['trainable_params'] / 1e9:.3f}e9 trainable; "
          f"{'bf16' if work['dtype_bytes'] == 2 else 'fp32'}, KL beta {work['beta']}"
          f"{' (reference model)' if work['beta'] > 0 and not work['use_peft'] else ''}{teacher_note}, "
          f"{work['rows']} completions per micro-batch, {work['generation_rows']} per generation, "
          f"G {work['num_generations']}")
    from grounding_rl.dev.memory import TEXT_TOKENS

    video = report["video"]
    clip = (f"{video['frames']} frames of {video['height']}x{video['width']} at {video['fps']:.4g} fps of a "
            f"{args.video_seconds:g} s clip of {args.frame_size[0]}x{args.frame_size[1]}")
    print(f"sequence: {work['video_tokens']} video" + (f" + {work['time_tokens']} timestamp" if work["time_tokens"]
                                                       else "")
          + f" + {TEXT_TOKENS} text + {work['completion_tokens']} completion tokens ("
          + (f"--video-tokens; timestamps of {clip}" if args.video_tokens else clip)
          + f"); activation checkpointing {'on' if work['checkpointing'] else 'off'}")
    if report["prompt_refused"]:
        print(f"note: the prompt ({work['prompt_tokens']} tokens) is longer than the recipe's max_prompt_length "
              f"({report['max_prompt_length']}): training would refuse it; raise max_prompt_length to train on it")
    print(f"per GPU, GiB, {args.gpus} GPU(s) of {args.gpu_memory:g} GiB:")
    header = (f"  {'strategy':<14} {'weights':>8} {'grads':>7} {'optim':>7} {'ref':>6} {'teach':>6} {'activ':>7} "
              f"{'other':>6} {'total':>7} {'DS states':>10}  fits")
    print(header)
    for row in report["strategies"]:
        b = row["bytes"]
        ds = row["deepspeed_model_states"]
        print(f"  {row['name']:<14} {b['weights'] / GIB:8.2f} {b['gradients'] / GIB:7.2f} {b['optimizer'] / GIB:7.2f} "
              f"{b['reference'] / GIB:6.2f} {b['teacher'] / GIB:6.2f} {b['activations'] / GIB:7.2f} "
              f"{b['overhead'] / GIB:6.2f} {b['total'] / GIB:7.2f} {'-' if ds is None else f'{ds / GIB:.2f}':>10}  "
              f"{'yes' if row['fits'] else 'NO'}")
    print("  (activations: the larger of training and generation, an estimate; teach: a distillation teacher's frozen "
          "weights; other: CUDA context and allocator, assumed; DS states: DeepSpeed's estimate with every parameter trainable; offloaded states need CPU RAM)")
    stages = {row["zero_stage"] for row in report["strategies"]} & {1, 2, 3}
    if stages:
        print("\nDeepSpeed's estimators (model states only):")
        print(_deepspeed_tables(shape, stages, args.gpus, args.nodes), end="")


if __name__ == "__main__":
    sys.exit(main())
