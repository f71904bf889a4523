"""The entry layer that ``grounding-rl train`` (GRPO) and ``grounding-rl sft`` share, so they read top to bottom alike:
parse (:func:`parse_training_args`) → resume (:func:`resolve_resume`) → output folder (:func:`claim_output_dir`) →
data (:func:`load_dataset`) → model (:func:`load_training_model`, seeded) → trainer → train → save
(:func:`finish_training`).

The YAML and the command line are parsed together by ``trl.TrlParser`` into three dataclasses: the script arguments
below (what to train on), the stage's training config (:class:`grounding_rl.update.config.GroundingGRPOConfig` or
:class:`grounding_rl.update.sft.GroundingSFTConfig`) and TRL's ``ModelConfig`` (model path, dtype, LoRA). Unknown keys
are an error. Multi-process runs go through ``accelerate launch`` or ``torchrun``.
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import logging
import re
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from grounding_rl.errors import UserError
from grounding_rl.paths import resolve_config_path, resolve_model_path

logger = logging.getLogger("grounding_rl.cli")


@dataclass
class GroundingScriptArguments:
    """What to train on; the same for GRPO and SFT (each field's help says what it does: :func:`load_dataset`,
    :func:`frame_cache`, :func:`claim_output_dir`; ``tiny_model``: :func:`grounding_rl.dev.tiny.ensure_from_config`)."""

    train_file: str = field(default=None, metadata={
        "help": "Canonical JSONL of training samples (required; grounding-rl prepare's output); relative video paths "
                "resolve against video_root or the file's folder."})
    video_root: str | None = field(default=None, metadata={"help": "Folder of the videos (relative paths)."})
    max_train_samples: int | None = field(default=None, metadata={
        "help": "Train on the first N samples only (smoke runs; after the duration bounds); None = all."})
    min_video_duration: float | None = field(
        default=None, metadata={"help": "Drop training samples whose video is shorter than this many seconds (their "
                                        "'duration'; kept when equal); None = no bound. TimeLens2: 3."})
    max_video_duration: float | None = field(
        default=None, metadata={"help": "Drop training samples whose video is longer than this many seconds (kept "
                                        "when equal); None = no bound. TimeLens2: 3600. The dropped count is logged "
                                        "and saved in grounding_config.json."})
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
    replace_output_dir: bool = field(
        default=False,
        metadata={"help": "Delete the run already in output_dir (its weights, checkpoint-N folders, logs: the files "
                          "its run_fingerprint.json lists) before training; refused when the folder holds anything "
                          "else (nothing is deleted then). Without it a non-empty output_dir is refused unless this "
                          "run resumes the one in it (resume_from_checkpoint)."},
    )


def _config_path(argv: list[str]) -> tuple[list[str], str | None]:
    """``(argv, path)``: ``argv`` with its ``--config PATH`` checked and resolved, written ``--config PATH`` (TRL's
    parser reads no ``--config=PATH``), and the first such path as the user wrote it, which messages name (resolved
    where that is another file: a ``../shared/…`` path under ``$GROUNDING_RL_SHARED``; None without one).

    Raises:
        UserError: ``--config`` without a path, or a path that is not a file.
    """
    out, path, rest = [], None, iter(argv)
    for arg in rest:
        if arg == "--config" or arg.startswith("--config="):
            value = arg.split("=", 1)[1] if arg.startswith("--config=") else next(rest, "--")
            if arg == "--config" and value.startswith("--"):
                raise UserError("--config needs the path of a YAML file (e.g. --config configs/demo_grpo.yaml)")
            resolved = resolve_config_path(value)
            if not Path(resolved).is_file():
                raise UserError(f"{value}: no such config file")
            # messages name the path as written; ~ and ../shared (resolved elsewhere) by the resolved one
            written = value if Path(value).resolve() == Path(resolved).resolve() else resolved
            out, path = out + ["--config", resolved], path or written
        else:
            out.append(arg)
    return out, path


def _closest(name: str, known) -> str:
    import difflib

    match = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.6)
    return f" (did you mean {match[0]!r}?)" if match else ""


def timelens_fixed() -> dict:
    """TimeLens's numbers, fixed by ``difficulty_sampling: timelens``, under the option names they had while they were
    settable (as an older ``run_fingerprint.json`` records them in ``data_selection``)."""
    from grounding_rl.data.selection import TIMELENS_DURATION_EDGES, TIMELENS_MEAN, TIMELENS_NUM_BINS, TIMELENS_STD

    return {"difficulty_gaussian_mean": TIMELENS_MEAN, "difficulty_gaussian_std": TIMELENS_STD,
            "difficulty_num_bins": TIMELENS_NUM_BINS, "difficulty_duration_edges": list(TIMELENS_DURATION_EDGES)}


def removed_keys() -> dict[str, str]:
    """Removed options → what replaced them (a preset's fixed number, or why the option went): the one line a YAML
    key or a flag naming one gets (:func:`_check_keys`)."""
    from grounding_rl.reward.shaping import TEMPSAMP_ALPHA, TEMPSAMP_THRESHOLD

    preset = "is fixed by reward_shaping: tempsamp (TempSamp-R1's"
    return {**{k: f"is fixed by difficulty_sampling: timelens (TimeLens's {v})" for k, v in timelens_fixed().items()},
            "reward_shaping_threshold": f"{preset} τ {TEMPSAMP_THRESHOLD})", "reward_shaping_alpha":
            f"{preset} α {TEMPSAMP_ALPHA})", "drop_zero_std_groups": "was removed: groups with equal rewards have "
            "advantage 0; dynamic_sampling resamples them", "check_first_batch": "was removed: the cheap check "
            "always runs before the first step"}


def _check_keys(parser, config_path: str | None, argv: list[str]) -> None:
    """Every key of the YAML and every ``--key`` of ``argv`` is a field of the parser's dataclasses.

    Raises:
        UserError: the first unknown key, with its file and line (or ``command line``) and the closest known key; a
            config that is not UTF-8, not valid YAML (with the line), repeats a key (the key and both lines,
            :func:`grounding_rl.yaml_files.load_yaml`) or is not a mapping.
    """
    from grounding_rl.yaml_files import key_lines, load_yaml

    removed = removed_keys()
    dests = {action.dest for action in parser._actions if action.dest != "help"}
    options = {opt for action in parser._actions for opt in action.option_strings}
    if config_path is not None:
        config = load_yaml(config_path)
        if config is not None and not isinstance(config, dict):
            raise UserError(f"{config_path}: a config must be a YAML mapping of 'key: value' lines")
        lines = key_lines(config_path)
        for key in config or {}:
            if key != "env" and key not in dests:
                where = f"{config_path}:{lines[str(key)]}" if str(key) in lines else config_path
                raise UserError(f"{where}: {key} {removed[key]}; drop it" if key in removed else
                                f"{where}: unknown key {key!r}{_closest(str(key), dests)}")
    args = iter(argv)
    for arg in args:
        flag = arg.split("=", 1)[0]
        if arg == "--config":
            next(args, None)  # its path
        elif arg.startswith("--") and flag not in options:
            key = flag[2:].replace("-", "_")
            raise UserError(f"command line: {flag} {removed[key]}; drop it" if key in removed else
                            f"command line: unknown option {flag}{_closest(flag, options)}")


def _origin(text: str, config_path: str | None, argv: list[str]) -> str:
    """Where the setting a message names first was given, for the message's prefix: ``command line`` when it is one of
    ``argv``'s ``--key`` overrides (they win over the YAML), ``FILE:LINE`` when it is a key of the config file, else
    the config file (``command line`` without one)."""
    from grounding_rl.yaml_files import key_lines

    given = {arg[2:].split("=", 1)[0].replace("-", "_") for arg in argv if arg.startswith("--") and arg != "--config"}
    lines = key_lines(config_path) if config_path else {}
    for word in re.findall(r"\w+", text):
        if word in given:
            return "command line"
        if word in lines:
            return f"{config_path}:{lines[word]}"
    return config_path or "command line"


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
        UserError: a missing ``--config`` path or file, a config that is not a YAML mapping, a key written twice
            (file, key and both lines), an unknown key (file, line and the closest known key), an invalid value (the
            config's own validation; numbers out of range, :func:`_check_numbers`: each line names where the setting
            was given, ``FILE:LINE`` or ``command line``, :func:`_origin`), a
            ``report_to`` tracker unknown or not installed (:func:`grounding_rl.update.trackers.check_trackers`), no
            ``train_file`` or no ``model_name_or_path``.
    """
    from trl import ModelConfig, TrlParser

    from grounding_rl.update.recipes import RECIPES, recipe_arguments

    argv, config_path = _config_path(sys.argv[1:] if argv is None else argv)
    recipes = recipe_arguments() if hasattr(config_class, "set_recipes") else []  # GRPO's configs take the recipes'
    parser = TrlParser((GroundingScriptArguments, config_class, ModelConfig, *recipes), prog=prog,
                       usage=f"{prog} --config CONFIG.yaml [--key value ...]", description=USAGE.format(
                           prog=prog, example=EXAMPLES.get(prog.rsplit(" ", 1)[-1], "configs/demo_grpo.yaml")),
                       formatter_class=_HelpFormatter)
    if any(a in ("-h", "--help") for a in argv):
        _hide_refused(parser, prog.rsplit(" ", 1)[-1])
        parser.parse_args_into_dataclasses(args=["--help"])  # prints the help and exits 0
    _check_keys(parser, config_path, argv)
    origin = functools.partial(_origin, config_path=config_path, argv=argv)  # where a message's setting was given
    try:
        script_args, training_args, model_args, *parsed = parser.parse_args_and_config(argv)
        if recipes:
            by_class = {type(args): args for args in parsed}
            training_args.set_recipes({name: by_class.get(recipe.arguments) for name, recipe in RECIPES.items()})
    except ValueError as err:
        raise UserError(f"{origin(str(err))}: {err}") from None
    _check_honoured(script_args, model_args, training_args, origin, "sft" if prog.endswith("sft") else "grpo")
    from grounding_rl.update.trackers import check_trackers, default_wandb_dir

    check_trackers(training_args.report_to, origin("report_to"))  # before any model loads
    if not script_args.train_file:
        raise UserError("train_file is required (a canonical JSONL; in the YAML or as --train_file)")
    if not model_args.model_name_or_path:
        raise UserError("model_name_or_path is required (in the YAML or as --model_name_or_path)")
    # against the working directory (a distillation teacher's: its arguments' own __post_init__)
    script_args.train_file = resolve_config_path(script_args.train_file)
    script_args.video_root = resolve_config_path(script_args.video_root)
    script_args.frame_cache_dir = resolve_config_path(script_args.frame_cache_dir)
    model_args.model_name_or_path = resolve_model_path(model_args.model_name_or_path)  # a hub id stays
    training_args.output_dir = resolve_config_path(training_args.output_dir)
    default_wandb_dir(training_args.report_to, training_args.output_dir)
    _check_numbers(script_args, training_args, model_args, origin)
    return script_args, training_args, model_args


def _hide_refused(parser, command: str) -> None:
    """Leave out of ``--help`` every option the command refuses set: the fields :data:`grounding_rl.update.fields.FIELDS`
    marks refused for the stage (or does not know), distill's GRPO-only settings
    (:data:`grounding_rl.update.distill_config.GRPO_ONLY`) and the recipes' :attr:`Recipe.refused`; passing one still
    gives its one-line refusal. ``command``: ``train``, ``sft`` or ``distill``; the description says how many were
    left out."""
    from grounding_rl.update.fields import FIELDS, REFUSED
    from grounding_rl.update.recipes import RECIPES

    stage = "sft" if command == "sft" else "grpo"
    hidden = {name for name, honour in FIELDS.items() if getattr(honour, stage) == REFUSED}
    if command == "distill":
        from grounding_rl.update.distill_config import GRPO_ONLY

        hidden |= set(GRPO_ONLY) | {key for recipe in RECIPES.values() for key in recipe.refused.get(command, {})}
    left_out = {action.dest for action in parser._actions if action.dest != "help" and action.option_strings
                and (action.dest in hidden or action.dest not in FIELDS)}
    for action in parser._actions:
        action.help = argparse.SUPPRESS if action.dest in left_out else action.help
    parser.description += (f"\n{len(left_out)} settings that {command} refuses are not listed (setting one is "
                           "an error naming why; grounding_rl/update/fields.py says who honours each).")


def _check_honoured(script_args, model_args, training_args, where, stage: str) -> None:
    """What the training config's own validation cannot see, before any model loads (also when the model folder does
    not exist yet): a refused field of the script arguments or ``trl.ModelConfig`` set
    (:func:`grounding_rl.update.fields.refused_settings`), the Hub settings
    (:func:`grounding_rl.update.hub.settings_problems`: ``push_to_hub`` offline, ``hub_*`` without it), and the k-bit
    rules of ``load_in_4bit`` / ``load_in_8bit``:
    CUDA and bitsandbytes present (:func:`grounding_rl.models.loading.kbit_unavailable`), only with ``use_peft`` (the
    quantized weights cannot be trained; ``trl.ModelConfig`` itself refuses both at once), and no 8-bit under DeepSpeed ZeRO-3 (transformers
    partitions no int8 weights).

    ``where(text)``: the message's prefix, where the setting ``text`` names was given (:func:`_origin`).

    Raises:
        UserError: one line naming where the field was set (file and line, or ``command line``) and the field.
    """
    from grounding_rl.update.fields import refused_settings

    from grounding_rl.update.hub import settings_problems

    refused = refused_settings(script_args, stage) + refused_settings(model_args, stage) + \
        settings_problems(training_args)  # push_to_hub offline, hub_* without push_to_hub
    if refused:
        raise UserError(f"{where(refused[0])}: {'; '.join(refused)}")
    if not (model_args.load_in_4bit or model_args.load_in_8bit):
        return
    from grounding_rl.models.loading import kbit_unavailable

    flag = "load_in_4bit" if model_args.load_in_4bit else "load_in_8bit"
    where = where(flag)  # the line's prefix from here on
    missing = kbit_unavailable()
    if missing:
        raise UserError(f"{where}: {flag}: k-bit loading needs CUDA and bitsandbytes ({missing}); drop {flag} or "
                        "run on a CUDA machine with bitsandbytes installed")
    if not model_args.use_peft:
        raise UserError(f"{where}: {flag} needs use_peft: true (k-bit weights are frozen; only LoRA adapters train)")
    from transformers.integrations import is_deepspeed_zero3_enabled

    if model_args.load_in_8bit and is_deepspeed_zero3_enabled():
        raise UserError(f"{where}: load_in_8bit with DeepSpeed ZeRO-3 is refused (int8 weights are not partitioned); "
                        "use load_in_4bit or ZeRO-2")


def _check_numbers(script_args, training_args, model_args, where) -> None:
    """The numbers the dataclasses' own validation leaves: the script arguments' (``max_train_samples`` ≥ 1,
    ``frame_cache_gb`` > 0, ``max_missing_fraction`` in [0, 1], ``min_video_duration`` and ``max_video_duration`` ≥ 0
    with min ≤ max) and the generation length against the model's
    context (:func:`grounding_rl.models.loading.context_length`, from ``config.json``, before any weights load):
    ``max_prompt_length`` + ``max_completion_length`` ≤ ``max_position_embeddings``.

    ``where(text)``: the message's prefix, where the setting ``text`` names was given (:func:`_origin`).

    Raises:
        UserError: one line naming where the key was set (file and line, or ``command line``), the key and the value.
    """
    from grounding_rl.errors import check_number

    def check(key, value, **bounds):
        try:
            check_number(key, value, **bounds)
        except UserError as err:
            raise UserError(f"{where(key)}: {err}") from None

    check("max_train_samples", script_args.max_train_samples, minimum=1)
    check("frame_cache_gb", script_args.frame_cache_gb, above=0)
    check("max_missing_fraction", script_args.max_missing_fraction, minimum=0.0, maximum=1.0)
    low, high = script_args.min_video_duration, script_args.max_video_duration
    check("min_video_duration", low, minimum=0.0)
    check("max_video_duration", high, minimum=0.0)
    if low is not None and high is not None and low > high:
        raise UserError(f"{where('min_video_duration max_video_duration')}: min_video_duration {low} is above "
                        f"max_video_duration {high} (seconds): no video would be kept")
    completion = getattr(training_args, "max_completion_length", None)
    if completion is not None:
        from grounding_rl.models.loading import context_length

        tokens, source = context_length(model_args.model_name_or_path, model_args.model_revision)
        prompt = training_args.max_prompt_length or 0
        check("max_completion_length", completion, maximum=tokens - prompt,
              bound=f"{tokens} tokens, {source}, less max_prompt_length {prompt}")


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Defaults shown (as transformers' parser does) and the description kept as written."""


# the recipe each trainer's --help shows in its example (distill: a distillation config, not a GRPO one)
EXAMPLES = {"sft": "configs/demo_sft.yaml", "train": "configs/demo_grpo.yaml",
            "distill": "configs/qwen2_5_vl_7b_to_3b_distill.yaml"}
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
    """Set the collective timeout from ``ddp_timeout``, then hand an existing process group to DeepSpeed before any
    model loads.

    ``ddp_timeout`` (seconds, default 1800) bounds every collective of the run: a rank that hangs (stopped, a node
    frozen) makes the others fail after it and exit (:func:`train_and_finish`). transformers passes it to
    ``init_process_group`` on GPUs but not with ``use_cpu`` (gloo), so it is set here on the default group either way
    (``torch.distributed.distributed_c10d.set_timeout``; DeepSpeed's ``comm`` wraps the same group). With ``use_cpu``
    the process group is created by accelerate's ``PartialState`` while building the TrainingArguments, but
    ``deepspeed.comm`` stays uninitialised, so ZeRO-3's ``zero.Init`` inside ``from_pretrained`` would see a world size
    of 1 and reject the batch sizes. No-op in one process.
    """
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        from datetime import timedelta

        from torch.distributed.distributed_c10d import set_timeout

        set_timeout(timedelta(seconds=training_args.ddp_timeout))
    if not (training_args.deepspeed or os.environ.get("ACCELERATE_USE_DEEPSPEED", "").lower() == "true"):
        return
    import deepspeed

    if dist.is_available() and dist.is_initialized() and not deepspeed.comm.is_initialized():
        deepspeed.init_distributed(dist_backend=dist.get_backend(), auto_mpi_discovery=False)


def load_dataset(script_args):
    """The training :class:`grounding_rl.data.dataset.GroundingDataset` (validation policy applied, videos outside
    [``min_video_duration``, ``max_video_duration``] dropped, then capped at ``max_train_samples``). Its
    ``duration_filter`` records the filter (``{"min_video_duration", "max_video_duration", "samples", "dropped"}``,
    None without bounds) for ``grounding_config.json``.

    Raises:
        UserError: more than ``max_missing_fraction`` of its distinct videos are missing (count and first paths);
            the duration bounds drop every sample.
    """
    from grounding_rl.data.dataset import GroundingDataset, filter_by_duration

    from grounding_rl.data.missing import check_fraction, missing_videos

    dataset = GroundingDataset.from_jsonl(script_args.train_file, video_root=script_args.video_root)
    low, high = script_args.min_video_duration, script_args.max_video_duration
    duration_filter = None
    if low is not None or high is not None:
        kept, dropped = filter_by_duration(dataset.samples, low, high)
        bounds = f"[{'0' if low is None else f'{low:g}'}, {'∞' if high is None else f'{high:g}'}] s"
        if not kept:
            raise UserError(f"{script_args.train_file}: all {dropped} samples have a video duration outside {bounds} "
                            "(min_video_duration / max_video_duration)")
        logger.info("dropped %d of %d training samples whose video duration lies outside %s (min_video_duration / "
                    "max_video_duration)", dropped, len(dataset), bounds)
        duration_filter = {"min_video_duration": low, "max_video_duration": high, "samples": len(dataset),
                           "dropped": dropped}
        dataset = GroundingDataset(kept)
    if script_args.max_train_samples:
        dataset = GroundingDataset(dataset.samples[: script_args.max_train_samples])
    dataset.duration_filter = duration_filter
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


def seed_everything(training_args) -> None:
    """Seed Python's ``random``, NumPy and torch (every device) with ``training_args.seed``, as
    ``transformers.Trainer.__init__`` does (``enable_full_determinism`` under ``full_determinism``, else
    ``set_seed``), but before the model and its LoRA adapters are built: PEFT draws ``lora_A`` from torch's global
    generator, so two runs with one seed start from the same adapter. The same seed on every rank (the adapters must
    agree; the GRPO trainer reseeds per rank for sampling afterwards)."""
    from transformers.trainer_utils import enable_full_determinism, set_seed

    (enable_full_determinism if training_args.full_determinism else set_seed)(training_args.seed)


def lora_settings(model_args) -> dict | None:
    """The LoRA settings of a run (``trl.ModelConfig``'s ``lora_*`` fields), None without ``use_peft``.

    Without ``lora_target_modules`` (and ``lora_target_parameters``) the target is the language model's attention
    and MLP projections, vision tower and mergers excluded
    (:data:`grounding_rl.models.loading.DEFAULT_LORA_TARGETS`), the modules every LoRA recipe here names; PEFT has no
    default for the Qwen-VL model types."""
    if not model_args.use_peft:
        return None
    from grounding_rl.models.loading import DEFAULT_LORA_TARGETS

    targets = model_args.lora_target_modules
    if targets is None and model_args.lora_target_parameters is None:
        targets = DEFAULT_LORA_TARGETS
    return {"r": model_args.lora_r, "alpha": model_args.lora_alpha, "dropout": model_args.lora_dropout,
            "target_modules": targets, "target_parameters": model_args.lora_target_parameters,
            "modules_to_save": model_args.lora_modules_to_save, "use_rslora": model_args.use_rslora,
            "use_dora": model_args.use_dora}


def load_training_model(script_args, model_args, training_args):
    """``(model, processor)`` to train: seeded first (:func:`seed_everything`), then
    :func:`grounding_rl.models.loading.load_policy` (remote code off), the vision tower frozen when asked, and — the
    one place that does it — wrapped with PEFT when ``use_peft`` (``trl.get_peft_config``, the target modules of
    :func:`lora_settings`).

    With ``load_in_4bit`` / ``load_in_8bit`` (checked by :func:`parse_training_args`: CUDA, bitsandbytes,
    ``use_peft``) the language model loads quantized (:func:`grounding_rl.models.loading.quantization_config`: vision
    tower, mergers and ``lm_head`` unquantized; the process's GPU,
    :func:`grounding_rl.models.loading.kbit_device_map`) and is prepared with
    ``peft.prepare_model_for_kbit_training`` (layer norms in float32, base frozen, gradient checkpointing as
    configured) before the LoRA wrap, as TRL's scripts do. Not run on this project's CPU test machines."""
    import copy

    from trl import get_peft_config

    from grounding_rl.models.loading import (freeze_vision_tower, kbit_device_map, load_policy, load_processor,
                                             quantization_config)

    seed_everything(training_args)
    quantization = quantization_config(model_args)
    model = load_policy(model_args.model_name_or_path, dtype=model_args.dtype,
                        attn_implementation=model_args.attn_implementation, revision=model_args.model_revision,
                        quantization_config=quantization,
                        device_map=kbit_device_map() if quantization is not None else None)
    processor = load_processor(model_args.model_name_or_path, revision=model_args.model_revision)
    if script_args.freeze_vision_tower:
        freeze_vision_tower(model)
    if quantization is not None:
        from peft import prepare_model_for_kbit_training

        model = prepare_model_for_kbit_training(
            model, use_gradient_checkpointing=bool(training_args.gradient_checkpointing),
            gradient_checkpointing_kwargs=training_args.gradient_checkpointing_kwargs)
    lora = lora_settings(model_args)
    if lora is not None:
        from peft import get_peft_model

        model_args = copy.copy(model_args)
        model_args.lora_target_modules = lora["target_modules"]
        model = get_peft_model(model, get_peft_config(model_args))
    return model, processor


def warn_unlike_the_checkpoint(model_args, training_args) -> str | None:
    """Warn (and return the message) when the run's ``prompt_template`` or ``video_layout`` differs from the one the
    starting checkpoint was trained with (its ``grounding_config.json``, e.g. an SFT warm start's): the run would
    teach or reward another answer format or prompt than the one the checkpoint learnt, often because the YAML left
    the key at its default. None when they agree or the checkpoint has no such file (a base model, a hub id)."""
    from grounding_rl.prompts.preprocessing import CONFIG_NAME, GroundingConfig

    try:
        saved = GroundingConfig.load(model_args.model_name_or_path)
    except (OSError, ValueError):
        return None
    changed = [f"{key} {getattr(training_args, key)!r} (the checkpoint's: {getattr(saved, key)!r})"
               for key in ("prompt_template", "video_layout")
               if saved is not None and getattr(saved, key) != getattr(training_args, key)]
    if not changed:
        return None
    message = (f"this run's prompt differs from the one {model_args.model_name_or_path} was trained with (its "
               f"{CONFIG_NAME}): {'; '.join(changed)}; set the checkpoint's value to continue in its format")
    logger.warning(message)
    return message


FINGERPRINT_FILE = "run_fingerprint.json"
SAMPLING_KEYS = ("num_generations", "max_completion_length", "temperature", "top_p", "top_k", "repetition_penalty",
                 "reward_funcs", "reward_weights", "think_text")


def run_fingerprint(script_args, training_args, model_args) -> dict:
    """What produced a run's checkpoints, written into each as ``run_fingerprint.json``
    (:class:`grounding_rl.update.saving.GroundingSaveMixin`) and compared on resume (:func:`resolve_resume`): the train
    file and its content hash, the video-duration bounds, the model and its fingerprint (:func:`grounding_rl.run_record.model_fingerprint`),
    prompt template, video layout, video and sampling settings, the difficulty-aware data selection, LoRA settings
    (:func:`lora_settings`), seed, data seed, a distillation teacher and its β, and package version (not the git
    commit). ``max_steps``,
    learning rate and the like are not in it: a finished run may be continued with more steps. ``outputs``: the
    patterns of what the run writes in its folder (:data:`grounding_rl.run_record.RUN_OUTPUTS`, what
    ``replace_output_dir`` may delete; not compared)."""
    from grounding_rl import __version__
    from grounding_rl.run_record import RUN_OUTPUTS, file_sha256, model_fingerprint
    from grounding_rl.update.recipes import RECIPES, own_args, teacher

    pair = teacher(training_args) if hasattr(training_args, "recipe_args") else None  # distillation's, and its β
    return {
        **({"teacher": pair[0], "teacher_fingerprint": model_fingerprint(pair[0], None), pair[1]: pair[2]}
           if pair else {}),
        "train_file": script_args.train_file, "train_sha256": file_sha256(script_args.train_file),
        "max_train_samples": script_args.max_train_samples, "min_video_duration": script_args.min_video_duration,
        "max_video_duration": script_args.max_video_duration, "model": model_args.model_name_or_path,
        "model_revision": model_args.model_revision,
        "model_fingerprint": model_fingerprint(model_args.model_name_or_path, model_args.model_revision),
        "prompt_template": training_args.prompt_template, "video_layout": training_args.video_layout,
        "video": training_args.video_settings.to_dict(),
        "sampling": {key: getattr(training_args, key) for key in SAMPLING_KEYS if hasattr(training_args, key)},
        "data_selection": {key: getattr(own_args(training_args, name), key) for name, recipe in RECIPES.items()
                           for key in recipe.fingerprint_keys} if hasattr(training_args, "recipe_args") else {},
        "lora": lora_settings(model_args), "seed": training_args.seed, "data_seed": training_args.data_seed,
        "version": __version__, "outputs": list(RUN_OUTPUTS),
    }


def _check_fingerprint(path: Path, fingerprint: dict | None, what: str, advice: str) -> None:
    """Refuse (UserError, :func:`grounding_rl.run_record.check_record`) when the ``run_fingerprint.json`` at ``path``
    differs from ``fingerprint``; where the train file and the model are may change, what they are may not."""
    from grounding_rl.run_record import check_record, read_record

    if fingerprint is not None:
        if "teacher" in fingerprint:  # older fingerprints recorded the teacher's β as teacher_divergence_beta
            beta = fingerprint.get("beta", fingerprint.get("distillation_beta"))
            fingerprint = {**fingerprint, "teacher_divergence_beta": beta}
        fixed, old = timelens_fixed(), (read_record(path) or {}).get("data_selection") or {}
        if "data_selection" in fingerprint and fixed.keys() & old.keys():  # recorded while they were options
            fingerprint = {**fingerprint, "data_selection": {**fingerprint["data_selection"], **fixed}}
        check_record(path, fingerprint, [k for k in fingerprint if k not in ("train_file", "model", "outputs")], what,
                     advice)


# What a training run leaves in its output_dir (besides checkpoint-N folders): only a folder holding one of them is
# removed by replace_output_dir.
RUN_FILES = (FINGERPRINT_FILE, "trainer_state.json", "training_args.bin", "config.json", "adapter_config.json",
             "grounding_config.json")


def claim_output_dir(script_args, training_args, fingerprint: dict | None, resume: str | None) -> None:
    """One run per output folder: a non-empty ``output_dir`` is used only by a resume of the run in it, or after
    ``replace_output_dir`` removed that run's files, so two runs' weights, adapters and ``checkpoint-N`` folders never
    mix (``eval`` would load one run's weights with the other's adapter).

    A resume of the run in it: ``resume`` (:func:`resolve_resume`) is a ``checkpoint-N`` of ``output_dir`` and every
    ``run_fingerprint.json`` there (top level and checkpoints) matches ``fingerprint``. Every rank checks alike; then
    the ranks that save (``should_save``: the main process, or each node's with ``save_on_each_node``) remove, between
    two barriers, so no rank writes before the old files are gone. With ``save_on_each_node`` the nodes' folders must
    be their own (:func:`_check_own_folders`). With ``resume_from_checkpoint: auto`` and only cut-short checkpoints
    (no complete one), this run's are removed alike and it starts from step 0.

    Raises:
        UserError: ``output_dir`` or ``frame_cache_dir`` is a file; two nodes' saving processes share ``output_dir``
            under ``save_on_each_node``; ``output_dir`` is not empty and not resumed; a file there comes from another run (what
            changed); ``replace_output_dir`` with a resume from that folder, on a folder holding no training run, or
            on a run folder holding anything the run did not write (a user's notes, an eval folder: the first such
            name; :func:`grounding_rl.run_record.foreign_to_run`). Nothing is deleted then.
    """
    cache = getattr(script_args, "frame_cache_dir", None)  # the other folder a run writes, checked as early
    if cache and Path(cache).exists() and not Path(cache).is_dir():
        raise UserError(f"frame_cache_dir: {cache} is a file, not a folder")
    out = Path(training_args.output_dir)
    if out.exists() and not out.is_dir():
        raise UserError(f"output_dir: {out} is a file, not a folder")
    _check_own_folders(training_args)
    entries = sorted(out.iterdir()) if out.is_dir() else []
    if not entries:
        return
    names = ", ".join(p.name for p in entries[:3]) + (f", … ({len(entries)} entries)" if len(entries) > 3 else "")
    checkpoints = [p for p in entries if p.is_dir() and p.name.startswith("checkpoint-")]
    is_run = bool(checkpoints) or any((out / name).exists() for name in RUN_FILES)
    inside = resume is not None and Path(resume).resolve().parent == out.resolve()
    if inside:
        if script_args.replace_output_dir:
            raise UserError(f"replace_output_dir: true would delete {resume}, the checkpoint this run resumes from; "
                            "drop one of the two")
        for path in [out / FINGERPRINT_FILE, *(p / FINGERPRINT_FILE for p in checkpoints)]:
            _check_fingerprint(path, fingerprint, f"output_dir: {path} was written by another run",
                               "resume with the settings that wrote it, replace it with --replace_output_dir true, or "
                               "give a new --output_dir")
        return
    if resume is None and str(training_args.resume_from_checkpoint or "").lower() == "auto" and checkpoints:
        # every checkpoint-N was cut short (a requeued job killed in its first save): this run's go, from step 0
        for path in [out / FINGERPRINT_FILE, *(p / FINGERPRINT_FILE for p in checkpoints)]:
            _check_fingerprint(path, fingerprint, f"output_dir: {path} was written by another run",
                               "give a new --output_dir, or replace it with --replace_output_dir true")
        _check_no_foreign(out, "resume_from_checkpoint: auto")
        _remove_on_saving_ranks(checkpoints, training_args, "resume_from_checkpoint auto: no complete checkpoint in "
                                "%s; removing %s and starting from step 0", out, ", ".join(p.name for p in checkpoints))
        return
    if not is_run:
        raise UserError(f"output_dir: {out} is not empty ({names}) and holds no training run; give an empty or new "
                        "--output_dir (replace_output_dir removes only a training run's folder)")
    if not script_args.replace_output_dir:
        how = "resume it with --resume_from_checkpoint true, " if checkpoints else ""
        raise UserError(f"output_dir: {out} already holds a run ({names}); {how}replace it with "
                        "--replace_output_dir true, or give a new --output_dir")
    _check_no_foreign(out, "replace_output_dir")
    _remove_on_saving_ranks(entries, training_args, "replace_output_dir: removing the run in %s (%s)", out, names)


def _check_no_foreign(out: Path, setting: str) -> None:
    """Refuse in one line naming ``setting``, nothing deleted, when ``out`` holds anything its run did not write
    (:func:`grounding_rl.run_record.foreign_to_run`)."""
    from grounding_rl.run_record import foreign_to_run, read_record

    foreign = foreign_to_run(out, read_record(out / FINGERPRINT_FILE))
    if foreign:
        more = f" and {len(foreign) - 3} more" if len(foreign) > 3 else ""
        raise UserError(f"{setting}: {out} holds {', '.join(foreign[:3])}{more}, which the run there did not write; "
                        "nothing was deleted: move it out, or give a new --output_dir")


def _remove_on_saving_ranks(paths: list[Path], training_args, message: str, *args) -> None:
    """Remove ``paths`` (folders and files) on the saving ranks (``should_save``), logging ``message % args``, between
    two barriers: every rank has checked before anything is removed, and none writes before it is gone."""
    from accelerate import PartialState  # the process group TrainingArguments set up (a no-op in one process)

    several = training_args.world_size > 1
    if several:
        PartialState().wait_for_everyone()
    if training_args.should_save:
        import shutil

        logger.info(message, *args)
        for path in paths:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
    if several:
        PartialState().wait_for_everyone()


PROBE = ".node_probe"  # PROBE.{launch}.{rank}: a saving process's mark in its output_dir while the folders are compared


def probing_ranks(folder: Path, launch: str, rank: int) -> list[int]:
    """The ranks other than ``rank`` whose probe of launch ``launch`` is in ``folder`` (:func:`_check_own_folders`)."""
    ranks = (int(p.name.rsplit(".", 1)[1]) for p in folder.glob(f"{PROBE}.{launch}.*"))
    return sorted(r for r in ranks if r != rank)


def _check_own_folders(training_args) -> None:
    """``save_on_each_node: true`` with several processes: each node's saving process writes a whole run into its
    ``output_dir``, so no two of them may share the folder (two nodes would write the same files at once). Each saving
    process leaves a probe named after this launch and its rank in its folder (created if need be); after a barrier
    each lists its folder; the probes are removed. No-op otherwise.

    Raises:
        UserError: on every rank, when a saving process found another's probe (both ranks and the folder).
    """
    if not training_args.save_on_each_node or training_args.world_size < 2:
        return
    import uuid

    import torch.distributed as dist

    args, out = training_args, Path(training_args.output_dir)
    launch = [uuid.uuid4().hex[:12]]
    dist.broadcast_object_list(launch, src=0)
    probe, created = out / f"{PROBE}.{launch[0]}.{args.process_index}", not out.exists()
    if args.should_save:
        out.mkdir(parents=True, exist_ok=True)
        probe.touch()
    dist.barrier()
    seen = probing_ranks(out, launch[0], args.process_index) if args.should_save else []
    shared: list = [None] * args.world_size
    dist.all_gather_object(shared, seen)  # every folder is listed before any probe goes
    if args.should_save:
        probe.unlink()
        if created:
            with contextlib.suppress(OSError):  # another node's process may have created it, or wrote into it
                out.rmdir()
    pairs = [sorted((rank, other)) for rank, others in enumerate(shared) for other in others]
    if pairs:
        raise UserError(f"save_on_each_node: true, but ranks {pairs[0][0]} and {pairs[0][1]} (each its node's saving "
                        f"process) share {out}: they would write the same files; drop save_on_each_node (the main "
                        "process alone writes a shared folder), or give each node an output_dir on its own disk")


def resolve_resume(training_args, fingerprint: dict | None = None) -> str | None:
    """The checkpoint to resume from: ``resume_from_checkpoint`` as given, or the newest complete ``checkpoint-N`` in
    ``output_dir`` for ``true`` / ``last`` / ``auto`` (:func:`grounding_rl.update.checkpoints.newest_complete`: a
    save cut short is skipped, each skipped one named in one line on stderr); ``auto`` with no complete checkpoint
    starts from step 0 (None), what a requeued cluster job runs every time.

    Weights, optimizer, scheduler, RNG states and the data order are restored exactly
    (:mod:`grounding_rl.update.resume`): the resumed run ends with the same weights as an uninterrupted one.

    Under several processes the ranks compare what they found (:func:`same_checkpoint_on_every_rank`): with an
    ``output_dir`` on each node's own disk, ``save_on_each_node: true`` gives every node its own checkpoints.

    Raises:
        UserError: ``true`` / ``last`` with no complete checkpoint in ``output_dir``, ranks that found different
            newest complete checkpoints, a path that is not a folder, an
            incomplete checkpoint named explicitly (what is missing or cut short,
            :func:`grounding_rl.update.checkpoints.checkpoint_problem`), a checkpoint without optimizer state
            (``optimizer.pt``, or DeepSpeed's ``latest``: e.g. saved with ``save_only_model: true``), or one whose ``run_fingerprint.json`` differs from ``fingerprint`` (:func:`run_fingerprint`; the
            message names what changed).
    """
    from grounding_rl.update.checkpoints import checkpoint_problem, newest_complete

    resume = training_args.resume_from_checkpoint
    if resume is None or (isinstance(resume, str) and resume.lower() in ("false", "none", "")):
        return None
    if isinstance(resume, str) and resume.lower() in ("true", "last", "auto"):
        found, skipped = newest_complete(training_args.output_dir)
        if training_args.world_size > 1:
            import torch.distributed as dist

            names = [None] * training_args.world_size
            dist.all_gather_object(names, Path(found).name if found else None)
            same_checkpoint_on_every_rank(names, training_args.output_dir)
        if skipped and training_args.should_save:  # each node's own folder with save_on_each_node
            print("resume_from_checkpoint: skipped " + "; ".join(f"{Path(folder).name} ({why}: a save cut short)"
                                                                   for folder, why in skipped), file=sys.stderr)
        if found is None:
            if resume.lower() == "auto":
                return None
            raise UserError(f"resume_from_checkpoint: no complete checkpoint-N folder in {training_args.output_dir}"
                            + (f" ({len(skipped)} incomplete)" if skipped else "")
                            + "; --resume_from_checkpoint auto starts from step 0 when there is none")
        resume = found
    elif not Path(resume).is_dir():
        raise UserError(f"resume_from_checkpoint: {resume} is not a checkpoint folder")
    _check_fingerprint(Path(resume) / FINGERPRINT_FILE, fingerprint,
                       f"resume_from_checkpoint: {resume} was written by another run",
                       "resume with the settings that wrote it, or start afresh with a new --output_dir")
    problem = checkpoint_problem(resume)
    if problem is not None:
        raise UserError(f"resume_from_checkpoint: {resume} is not a complete train/sft checkpoint ({problem}); "
                        "--resume_from_checkpoint true takes the newest complete one")
    if not (Path(resume, "optimizer.pt").is_file() or Path(resume, "latest").is_file()):  # DeepSpeed: latest
        raise UserError(f"resume_from_checkpoint: {resume} holds no optimizer state (saved with save_only_model: "
                        f"true); start a new run from it with --model_name_or_path {resume} instead")
    return resume


def same_checkpoint_on_every_rank(names: list[str | None], output_dir: str) -> None:
    """Every rank resumes from the same step: ``names[r]`` is the newest complete ``checkpoint-N`` rank ``r`` found in
    its ``output_dir`` (None: none). They differ when the nodes' folders are their own disks and only the main
    process saved (``save_on_each_node: false``): the other nodes hold no checkpoint to resume from.

    Raises:
        UserError: the names differ (each rank's, and what to set).
    """
    if len(set(names)) > 1:
        found = ", ".join(f"rank {rank}: {name or 'none'}" for rank, name in enumerate(names))
        raise UserError(f"resume_from_checkpoint: the ranks found different newest complete checkpoints in "
                        f"{output_dir} ({found}); where each node's output_dir is its own disk, train with "
                        "save_on_each_node: true so that every node keeps its own copy of each checkpoint")


def check_teacher(model_args, training_args) -> None:
    """A distillation teacher (``teacher_model_name_or_path``) checked against the student from their tokenizers
    alone, before any weights load (:func:`grounding_rl.update.recipes.distillation.check_pair`); nothing without one.

    Raises:
        UserError: one line: the tokenizers disagree on a shared id, or the chat tokens differ and the template is not
            thinking-free.
    """
    from grounding_rl.update.recipes import teacher

    pair = teacher(training_args)
    if not pair:
        return
    from grounding_rl.models.loading import load_processor
    from grounding_rl.update.recipes.distillation import check_pair

    student = load_processor(model_args.model_name_or_path, revision=model_args.model_revision)
    check_pair(student.tokenizer, load_processor(pair[0]).tokenizer, training_args.prompt_template, pair[0])


def train_and_finish(trainer, resume: str | None, prog: str) -> int:
    """Train (from ``resume``), then :func:`finish_training`; returns the exit status.

    SIGTERM, SIGUSR1 and SIGINT stop the run at the next point where it can resume exactly, with a checkpoint
    there (:class:`grounding_rl.update.preemption.PreemptionCallback`); the final files are then not written (the
    run is not finished), one line says what was kept and how to continue, and the status is ``128 + signal``
    (:func:`grounding_rl.stopping.exit_code`: 143 for SIGTERM, 138 for SIGUSR1, 130 for SIGINT) in one process, 0 on
    every rank of several (a launcher such as torchrun reports any other status as a failure; ``scripts/train.sh``
    exits with ``128 + signal`` then). A second signal exits at once (:func:`grounding_rl.stopping.stop_signals`).

    A rank that dies (its connections close: the others fail at their next collective, within a second) or hangs
    (the others fail after ``ddp_timeout`` seconds, :func:`init_deepspeed_comm`) ends the run on every other rank: one
    line naming the lost rank (:func:`peer_lost`) and exit 2 at once, without a save, also when a stop signal had
    arrived (exit ``128 + signal`` then); the checkpoint being saved, if any, never gets its mark, so
    ``--resume_from_checkpoint auto`` (or ``accelerate launch --max_restarts N``, which reruns the same command)
    continues from the newest complete one.
    """
    import signal

    from grounding_rl.stopping import exit_code, stop_signals
    from grounding_rl.update.preemption import PreemptionCallback, any_rank

    if hasattr(trainer, "num_generations"):  # train, distill: grounding-rl check's a, b, c on the first batch
        from grounding_rl.update.check import first_batch_checks

        failed = [c for c in first_batch_checks(trainer) if not c.passed]
        if failed:
            print(f"{prog}: the first batch's check: {failed[0].line()}", file=sys.stderr)
            return 1
    with stop_signals(prog, graceful=True) as request:
        callback = PreemptionCallback(request, getattr(trainer.args, "generation_window", 1),
                                      any_rank(trainer.accelerator))
        trainer.add_callback(callback)
        from grounding_rl.update.curves import curves_callback
        from grounding_rl.update.hub import attach

        trainer.add_callback(curves_callback())  # training_curves.png at each save and at the end
        attach(trainer)  # push_to_hub: each complete checkpoint, after its mark
        try:
            result = trainer.train(resume_from_checkpoint=resume)
        except Exception as err:  # noqa: BLE001 - only a lost peer ends here; the rest re-raise
            _exit_if_peer_lost(err, trainer, prog, request.signum)
            raise
        if callback.stopped_at is None:
            _finish(trainer, result, prog, request.signum)
            return 0
        signum = request.signum or signal.SIGTERM  # a rank the signal did not reach stops with its peers
        if trainer.is_world_process_zero():  # before any rank exits: a launcher tears the others down then
            folder = Path(trainer.args.output_dir) / f"checkpoint-{callback.stopped_at}"
            print(f"{prog}: stopped by {signal.Signals(signum).name} at step {callback.stopped_at} of "
                  f"{trainer.state.max_steps}: {folder} saved; run the same command with --resume_from_checkpoint "
                  "auto to continue", file=sys.stderr, flush=True)
        several = trainer.accelerator.num_processes > 1
        trainer.accelerator.wait_for_everyone()
        trainer.accelerator.end_training()
    # under a launcher every rank exits 0, so it ends without a failure report; scripts/train.sh, which forwarded the
    # signal, exits with 128 + signal itself
    return 0 if several else exit_code(signum)


def _finish(trainer, result, prog: str, signum) -> None:
    """:func:`finish_training`, where a full disk is the user's one line and a lost peer exits at once."""
    try:
        finish_training(trainer, result)
    except Exception as err:  # noqa: BLE001 - only a full disk becomes the user's line; the rest re-raise
        from grounding_rl.errors import disk_error

        _exit_if_peer_lost(err, trainer, prog, signum)
        why = disk_error(err)
        if why is None:
            raise
        raise UserError(f"{trainer.args.output_dir}: writing the final model and run files failed ({why}); "
                        "the checkpoints are intact: free space and run the same command with "
                        "--resume_from_checkpoint auto") from err


# what gloo and NCCL say when a peer process died (its connections closed) or hung past the collective timeout
PEER_LOST = ("Connection closed by peer", "Connection reset by peer", "Broken pipe", "Timed out waiting",
             "Socket Timeout", "NCCL communicator was aborted", "Watchdog caught collective operation timeout")


def peer_lost(err: BaseException, rank: int, world_size: int, timeout_s: float) -> str | None:
    """The one line for a collective that failed because another rank is gone, or None for any other error.

    Args:
        err: the error training raised (gloo raises a ``RuntimeError``, ``torch.distributed.DistError`` subclasses).
        rank, world_size: this process's rank and the number of ranks.
        timeout_s: the collective timeout (``ddp_timeout``, seconds) a hung rank is waited for.
    Returns:
        ``"rank 1 of 2 lost (...)"`` — with 2 ranks the lost one is the other; with more, gloo names only its
        address, so the line names this rank — or None when ``err`` is not a lost peer (a message of gloo, NCCL or a
        ``torch.distributed`` error with one of :data:`PEER_LOST`).
    """
    text = str(err)
    cause = next((marker for marker in PEER_LOST if marker in text), None)
    from_collective = "gloo" in text or "NCCL" in text or type(err).__name__ in ("DistError", "DistBackendError",
                                                                                 "DistNetworkError")
    if cause is None or world_size < 2 or not from_collective:
        return None
    how = (f"it stopped answering for ddp_timeout={timeout_s:g} s" if "Time" in cause
           else "it died: its connection closed")
    who = f"rank {1 - rank} of 2" if world_size == 2 else f"a peer of rank {rank} (of {world_size})"
    return f"{who} lost ({how}: {cause})"


def _exit_if_peer_lost(err: BaseException, trainer, prog: str, signum: int | None) -> None:
    """When ``err`` is a lost peer (:func:`peer_lost`): one line on stderr and ``os._exit`` at once — 2, or ``128 +
    signal`` when a stop signal had arrived — without a save (a collective save would wait on the dead peer; the
    checkpoint being saved never gets its mark) and without the interpreter's teardown, which can block on the dead
    peer too. Returns for any other error."""
    line = peer_lost(err, trainer.args.process_index, trainer.args.world_size, trainer.args.ddp_timeout)
    if line is None:
        return
    import signal

    from grounding_rl.stopping import exit_code

    stopped = f"; {signal.Signals(signum).name} received: exiting without a save" if signum else ""
    print(f"{prog}: error: {line}{stopped}; the last complete checkpoint is kept: run the same command with "
          "--resume_from_checkpoint auto (accelerate launch --max_restarts N does it by itself)",
          file=sys.stderr, flush=True)
    os._exit(exit_code(signum) if signum else 2)


def finish_training(trainer, result) -> None:
    """Save the final model into ``output_dir`` (with processor, ``grounding_config.json`` and model card, through
    :class:`grounding_rl.update.saving.GroundingSaveMixin`), then the files open-r1 and TRL scripts leave:
    ``train_results.json`` / ``all_results.json`` (``save_metrics``) and ``trainer_state.json`` with
    ``log_history`` (``save_state``), also when ``save_strategy`` is ``"no"``. All ranks leave together; then, with
    ``push_to_hub``, the main process pushes the folder (:func:`grounding_rl.update.hub.push_run`)."""
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
    from grounding_rl.update.hub import push_run

    push_run(trainer)  # push_to_hub: after every file of the run, on the main process alone (the others have left)
