"""The entry layer that ``grounding-rl train`` (GRPO) and ``grounding-rl sft`` share, so they read top to bottom alike:
parse (:func:`parse_training_args`) → data (:func:`load_dataset`) → model (:func:`load_training_model`) → trainer →
resume (:func:`resolve_resume`) → train → save (:func:`finish_training`).

The YAML and the command line are parsed together by ``trl.TrlParser`` into three dataclasses: the script arguments
below (what to train on), the stage's training config (:class:`grounding_rl.update.config.GroundingGRPOConfig` or
:class:`grounding_rl.update.sft.GroundingSFTConfig`) and TRL's ``ModelConfig`` (model path, dtype, LoRA). Unknown keys
are an error. Multi-process runs go through ``accelerate launch`` or ``torchrun``.
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from grounding_rl.errors import UserError, reading
from grounding_rl.paths import resolve_config_path, resolve_model_path

logger = logging.getLogger("grounding_rl.cli")


@dataclass
class GroundingScriptArguments:
    """What to train on; the same for GRPO and SFT.

    Attributes:
        train_file: canonical JSONL (``grounding-rl prepare`` output); relative video paths resolve against
            ``video_root`` or the file's folder.
        video_root: folder holding the videos, or None.
        max_train_samples: use only the first N samples (smoke runs), None = all.
        freeze_vision_tower: keep the vision encoder fixed (no gradients into it).
        frame_cache_dir, frame_cache_gb: optional :class:`grounding_rl.data.cache.FrameCache` for decoded clips.
        max_missing_fraction: the share of missing or unreadable videos that stops the run
            (:mod:`grounding_rl.data.missing`).
        tiny_model: used only by ``scripts/train.sh`` and ``scripts/demo.sh``
            (:func:`grounding_rl.models.tiny.ensure_from_config`).
    """

    train_file: str = field(default=None, metadata={"help": "Canonical JSONL of training samples (required)."})
    video_root: str | None = field(default=None, metadata={"help": "Folder of the videos (relative paths)."})
    max_train_samples: int | None = field(default=None, metadata={"help": "Train on the first N samples only."})
    freeze_vision_tower: bool = field(default=False, metadata={"help": "Freeze the vision encoder."})
    frame_cache_dir: str | None = field(
        default=None,
        metadata={"help": "Folder of an on-disk frame cache (decode each clip once across epochs); None = off."},
    )
    frame_cache_gb: float = field(default=20.0, metadata={"help": "Size bound of the frame cache in GB."})
    max_missing_fraction: float = field(
        default=0.05,
        metadata={"help": "Fail when more than this share of the training videos is missing (checked before "
                          "training) or unreadable (counted as they come, GRPO); 1.0 = never, substitutes only."},
    )
    tiny_model: dict | str | None = field(
        default=None,
        metadata={"help": "A tiny random-weight model for CPU runs: {tokenizer: DIR, hidden_size: N, ...}; "
                          "scripts/train.sh builds it at model_name_or_path when missing (grounding-rl tiny-model)."},
    )


def _config_path(argv: list[str]) -> list[str]:
    """Check and resolve the ``--config PATH`` of ``argv`` (returned as a new list).

    Raises:
        UserError: ``--config`` without a path, or a path that is not a file.
    """
    argv = list(argv)
    for i, arg in enumerate(argv):
        if arg == "--config" or arg.startswith("--config="):
            if arg == "--config":
                if i + 1 >= len(argv) or argv[i + 1].startswith("--"):
                    raise UserError("--config needs the path of a YAML file (e.g. --config configs/demo_grpo.yaml)")
                value, put = argv[i + 1], lambda v, i=i: argv.__setitem__(i + 1, v)
            else:
                value, put = arg.split("=", 1)[1], lambda v, i=i: argv.__setitem__(i, f"--config={v}")
            resolved = resolve_config_path(value)
            if not Path(resolved).is_file():
                raise UserError(f"{value}: no such config file")
            put(resolved)
    return argv


def _read_config(path: str) -> tuple[dict, list[str]]:
    """The YAML mapping of a config file and its lines (for naming a key's line).

    Raises:
        UserError: the file is not UTF-8, not valid YAML (with the line) or not a mapping.
    """
    import yaml

    with reading(path), open(path, encoding="utf-8-sig") as handle:
        text = handle.read()
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else path
        raise UserError(f"{where}: not valid YAML ({getattr(err, 'problem', None) or err})") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise UserError(f"{path}: a config must be a YAML mapping of 'key: value' lines")
    return data, text.splitlines()


def _closest(name: str, known) -> str:
    import difflib

    match = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.6)
    return f" (did you mean {match[0]!r}?)" if match else ""


def _check_keys(parser, config_path: str | None, argv: list[str]) -> None:
    """Every key of the YAML and every ``--key`` of ``argv`` is a field of the parser's dataclasses.

    Raises:
        UserError: the first unknown key, with its file and line (or ``command line``) and the closest known key.
    """
    dests = {action.dest for action in parser._actions if action.dest != "help"}
    options = {opt for action in parser._actions for opt in action.option_strings}
    if config_path is not None:
        config, lines = _read_config(config_path)
        for key in config:
            if key != "env" and key not in dests:
                number = next((i for i, line in enumerate(lines, 1) if line.split(":", 1)[0].strip() == str(key)),
                              None)
                where = f"{config_path}:{number}" if number else config_path
                raise UserError(f"{where}: unknown key {key!r}{_closest(str(key), dests)}")
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg == "--config":
            skip = True
            continue
        if arg.startswith("--") and not arg.startswith("--config="):
            flag = arg.split("=", 1)[0]
            if flag not in options:
                raise UserError(f"command line: unknown option {flag}{_closest(flag, options)}")


def parse_training_args(config_class, argv: list[str] | None, prog: str):
    """``(script_args, training_args, model_args)`` from ``--config X.yaml`` plus ``--key value`` overrides.

    Building the training config first also sets up the process group and registers a DeepSpeed config, which ZeRO-3
    needs before any model is loaded. Paths (train file, video root, model, output folder), in the YAML as on the
    command line, resolve against the working directory (:func:`grounding_rl.paths.resolve_config_path`; a model
    path that does not exist is a hub id, :func:`grounding_rl.paths.resolve_model_path`).

    Args:
        config_class: the stage's ``TrainingArguments`` subclass.
        argv: command-line arguments (None = ``sys.argv[1:]``).
        prog: program name for ``--help``.

    Raises:
        UserError: a missing ``--config`` path or file, a config that is not a YAML mapping, an unknown key (file,
            line and the closest known key), an invalid value (the config's own validation, naming the file), no
            ``train_file`` or no ``model_name_or_path``.
    """
    from trl import ModelConfig, TrlParser

    argv = _config_path(sys.argv[1:] if argv is None else argv)
    parser = TrlParser((GroundingScriptArguments, config_class, ModelConfig), prog=prog,
                       usage=f"{prog} --config CONFIG.yaml [--key value ...]", description=USAGE.format(
                           prog=prog, example=f"configs/demo_{'sft' if prog.endswith('sft') else 'grpo'}.yaml"),
                       formatter_class=_HelpFormatter)
    config_path = next((argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--config"), None)
    config_path = config_path or next((a.split("=", 1)[1] for a in argv if a.startswith("--config=")), None)
    if any(a in ("-h", "--help") for a in argv):
        parser.parse_args_into_dataclasses(args=["--help"])  # prints the help and exits 0
    _check_keys(parser, config_path, argv)
    if config_path is not None:  # TRL's parser reads "--config PATH" only
        argv = [a for a in argv if not a.startswith("--config=")] + (
            ["--config", config_path] if "--config" not in argv else [])
    try:
        script_args, training_args, model_args = parser.parse_args_and_config(argv)
    except ValueError as err:
        raise UserError(f"{config_path or 'command line'}: {err}") from None
    if not script_args.train_file:
        raise UserError("train_file is required (a canonical JSONL; in the YAML or as --train_file)")
    if not model_args.model_name_or_path:
        raise UserError("model_name_or_path is required (in the YAML or as --model_name_or_path)")
    script_args.train_file = resolve_config_path(script_args.train_file)
    script_args.video_root = resolve_config_path(script_args.video_root)
    script_args.frame_cache_dir = resolve_config_path(script_args.frame_cache_dir)
    model_args.model_name_or_path = resolve_model_path(model_args.model_name_or_path)
    training_args.output_dir = resolve_config_path(training_args.output_dir)
    return script_args, training_args, model_args


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Defaults shown (as transformers' parser does) and the description kept as written."""


USAGE = """Settings come from a YAML config (--config CONFIG.yaml) and --key value overrides of any of its keys, e.g.
  {prog} --config {example} --learning_rate 2e-6 --output_dir outputs/run1
The recipes in configs/ (configs/README.md lists each and its source) show the knobs in use; every key is one of the
options below (data and model first, then training: transformers' TrainingArguments and TRL's names)."""


def setup_logging(training_args) -> None:
    """INFO on the main process, WARNING elsewhere."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    logging.basicConfig(level=logging.INFO if training_args.process_index == 0 else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def init_deepspeed_comm(training_args) -> None:
    """Hand an existing process group to DeepSpeed before any model loads.

    With ``use_cpu`` (gloo) the process group is created by accelerate's ``PartialState`` while building the
    TrainingArguments, but ``deepspeed.comm`` stays uninitialised, so ZeRO-3's ``zero.Init`` inside
    ``from_pretrained`` would see a world size of 1 and reject the batch sizes. No-op without DeepSpeed.
    """
    if not (training_args.deepspeed or os.environ.get("ACCELERATE_USE_DEEPSPEED", "").lower() == "true"):
        return
    import deepspeed
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and not deepspeed.comm.is_initialized():
        deepspeed.init_distributed(dist_backend=dist.get_backend(), auto_mpi_discovery=False)


def load_dataset(script_args):
    """The training :class:`grounding_rl.data.dataset.GroundingDataset` (validation policy applied, capped at
    ``max_train_samples``).

    Raises:
        UserError: more than ``max_missing_fraction`` of its distinct videos are missing (count and first paths).
    """
    from grounding_rl.data.dataset import GroundingDataset

    from grounding_rl.data.missing import check_fraction, missing_videos

    dataset = GroundingDataset.from_jsonl(script_args.train_file, video_root=script_args.video_root)
    if script_args.max_train_samples:
        dataset = GroundingDataset(dataset.samples[: script_args.max_train_samples])
    absent, total = missing_videos(sample["video"] for sample in dataset.samples)
    check_fraction(absent, total, script_args.max_missing_fraction, f"{script_args.train_file}: missing",
                   "check video_root")
    logger.info("%d training samples from %s (%d of %d videos missing, replaced by substitutes)", len(dataset),
                script_args.train_file, len(absent), total)
    return dataset


def frame_cache(script_args):
    """The optional on-disk frame cache, or None."""
    if not script_args.frame_cache_dir:
        return None
    from grounding_rl.data.cache import FrameCache

    return FrameCache(script_args.frame_cache_dir, int(script_args.frame_cache_gb * 1e9))


def load_training_model(script_args, model_args):
    """``(model, processor)`` to train: :func:`grounding_rl.models.loading.load_policy` (remote code off), the vision
    tower frozen when asked, and — the one place that does it — wrapped with PEFT when ``use_peft``
    (``trl.get_peft_config``)."""
    from trl import get_peft_config

    from grounding_rl.models.loading import freeze_vision_tower, load_policy, load_processor

    model = load_policy(model_args.model_name_or_path, dtype=model_args.dtype,
                        attn_implementation=model_args.attn_implementation, revision=model_args.model_revision)
    processor = load_processor(model_args.model_name_or_path, revision=model_args.model_revision)
    if script_args.freeze_vision_tower:
        freeze_vision_tower(model)
    peft_config = get_peft_config(model_args)
    if peft_config is not None:
        from peft import get_peft_model

        model = get_peft_model(model, peft_config)
    return model, processor


FINGERPRINT_FILE = "run_fingerprint.json"
SAMPLING_KEYS = ("num_generations", "max_completion_length", "temperature", "top_p", "top_k", "repetition_penalty",
                 "reward_funcs", "reward_weights", "think_text")


def run_fingerprint(script_args, training_args, model_args) -> dict:
    """What produced a run's checkpoints, written into each as ``run_fingerprint.json``
    (:class:`grounding_rl.update.saving.GroundingSaveMixin`) and compared on resume (:func:`resolve_resume`): the train
    file and its content hash, the model and its fingerprint (:func:`grounding_rl.data.fingerprint.model_fingerprint`),
    prompt template, video layout, video and sampling settings, the difficulty-aware data selection, seed and package
    version (not the git commit). ``max_steps``,
    learning rate and the like are not in it: a finished run may be continued with more steps."""
    from grounding_rl import __version__
    from grounding_rl.data.fingerprint import file_sha256, model_fingerprint
    from grounding_rl.update.config import DATA_SELECTION_KEYS

    return {
        "train_file": script_args.train_file, "train_sha256": file_sha256(script_args.train_file),
        "max_train_samples": script_args.max_train_samples, "model": model_args.model_name_or_path,
        "model_revision": model_args.model_revision,
        "model_fingerprint": model_fingerprint(model_args.model_name_or_path, model_args.model_revision),
        "prompt_template": training_args.prompt_template, "video_layout": training_args.video_layout,
        "video": training_args.video_settings.to_dict(),
        "sampling": {key: getattr(training_args, key) for key in SAMPLING_KEYS if hasattr(training_args, key)},
        "data_selection": {key: getattr(training_args, key) for key in DATA_SELECTION_KEYS
                           if hasattr(training_args, key)},
        "seed": training_args.seed, "version": __version__,
    }


def _check_fingerprint(folder: str, fingerprint: dict | None) -> None:
    """Raises UserError when the checkpoint's ``run_fingerprint.json`` differs from ``fingerprint``."""
    import json

    from grounding_rl.data.fingerprint import changes

    path = Path(folder) / FINGERPRINT_FILE
    if fingerprint is None or not path.is_file():
        return
    paths = ("train_file", "model")  # where they are may change; what they are may not
    differ = changes(json.loads(path.read_text(encoding="utf-8")), fingerprint, [k for k in fingerprint
                                                                                  if k not in paths])
    if differ:
        raise UserError(f"resume_from_checkpoint: {folder} was written by another run ({'; '.join(differ)}); resume "
                        "with the settings that wrote it, or start afresh with a new --output_dir")


def resolve_resume(training_args, fingerprint: dict | None = None) -> str | None:
    """The checkpoint to resume from: ``resume_from_checkpoint`` as given, or the last ``checkpoint-N`` in
    ``output_dir`` for ``true`` / ``last``.

    Weights, optimizer, scheduler, RNG states and the data order are restored exactly
    (:mod:`grounding_rl.update.resume`): the resumed run ends with the same weights as an uninterrupted one.

    Raises:
        UserError: ``true`` / ``last`` with no checkpoint in ``output_dir``, a path that is not a folder, a
            checkpoint without trainer state or optimizer state, or one whose ``run_fingerprint.json`` differs from
            ``fingerprint`` (:func:`run_fingerprint`; the message names what changed).
    """
    from transformers.trainer_utils import get_last_checkpoint

    resume = training_args.resume_from_checkpoint
    if resume is None or (isinstance(resume, str) and resume.lower() in ("false", "none", "")):
        return None
    if isinstance(resume, str) and resume.lower() in ("true", "last"):
        found = get_last_checkpoint(training_args.output_dir) if Path(training_args.output_dir).is_dir() else None
        if found is None:
            raise UserError(f"resume_from_checkpoint: no checkpoint-N folder in {training_args.output_dir}")
        resume = found
    elif not Path(resume).is_dir():
        raise UserError(f"resume_from_checkpoint: {resume} is not a checkpoint folder")
    _check_fingerprint(resume, fingerprint)
    return _check_resumable(resume)


def _check_resumable(folder: str) -> str:
    """``folder`` when it holds what an exact resume needs: ``trainer_state.json`` and the optimizer state
    (``optimizer.pt``, or DeepSpeed's ``latest`` and ``global_stepN/``).

    Raises:
        UserError: one of them is missing (e.g. a checkpoint written with ``save_only_model: true``).
    """
    path = Path(folder)
    if not (path / "trainer_state.json").is_file():
        raise UserError(f"resume_from_checkpoint: {folder} has no trainer_state.json (not a train/sft checkpoint)")
    if not ((path / "optimizer.pt").is_file() or (path / "latest").is_file()):
        raise UserError(f"resume_from_checkpoint: {folder} holds no optimizer state (saved with save_only_model: "
                        f"true); start a new run from it with --model_name_or_path {folder} instead")
    return folder


def finish_training(trainer, result) -> None:
    """Save the final model into ``output_dir`` (with processor, ``grounding_config.json`` and model card, through
    :class:`grounding_rl.update.saving.GroundingFilesCallback`), then the files open-r1 and TRL scripts leave:
    ``train_results.json`` / ``all_results.json`` (``save_metrics``) and ``trainer_state.json`` with
    ``log_history`` (``save_state``), also when ``save_strategy`` is ``"no"``. All ranks leave together."""
    output_dir = trainer.args.output_dir
    trainer.save_model(output_dir)
    metrics = dict(result.metrics)
    metrics["train_samples"] = len(trainer.train_dataset)
    trainer.log_metrics("train", metrics)
    trainer.save_metrics("train", metrics)
    trainer.save_state()
    if trainer.is_world_process_zero():
        logger.info("done: %s; model, grounding_config.json and README.md in %s", metrics, output_dir)
    # leave together: a rank exiting while another still tears down its communicator can abort at interpreter exit
    trainer.accelerator.wait_for_everyone()
    trainer.accelerator.end_training()
