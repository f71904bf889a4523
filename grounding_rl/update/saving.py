"""What every checkpoint and the final output folder hold besides the weights and the processor: the
``grounding_config.json`` that evaluation and inference reuse, and a model card (``README.md``, as TRL's trainers write
one) saying what the model is and how it was trained, so a folder can be pushed to the Hub as it is.

Both trainers (GRPO and SFT) mix in :class:`GroundingSaveMixin`; ``transformers.Trainer`` calls ``save_model`` for every
checkpoint and for the final save, so this is the one place those files are written, and where the saved files get the
permissions ``open()`` would give them (:func:`grounding_rl.paths.follow_umask`: safetensors writes ``0o600``).
"""
from __future__ import annotations

import shlex
import sys
from pathlib import Path

from grounding_rl.models.loading import DEFAULT_LORA_TARGETS
from grounding_rl.paths import follow_umask
from grounding_rl.run_record import write_record

MODEL_CARD = "README.md"


SECRET_FLAGS = ("--hub_token",)  # their values never reach the card (it may be pushed to a public repository)


def training_command(argv: list[str] | None = None) -> str:
    """The command line of this run, quoted for a shell (``grounding-rl <subcommand> …``), the value of
    ``--hub_token`` replaced by ``***``."""
    argv = list(sys.argv if argv is None else argv)
    shown = []
    for i, arg in enumerate(argv):
        flag = arg.split("=", 1)[0]
        if flag in SECRET_FLAGS and "=" in arg:
            arg = f"{flag}=***"
        elif i and argv[i - 1] in SECRET_FLAGS:
            arg = "***"
        shown.append(arg)
    return " ".join(shlex.quote(a) for a in shown)


def model_card(grounding_config, base_model: str | None, stage: str, command: str | None,
               lora_targets: str | None = None, teacher: str | None = None, datasets: list[str] | None = None,
               trackers: list[str] | None = None):
    """The ``README.md`` of a checkpoint, a ``huggingface_hub.ModelCard``: its Hub metadata (``ModelCardData``: library,
    pipeline tag, tags ``grounding-rl``, ``video-temporal-grounding`` and the stage's ``grpo`` / ``sft`` /
    ``distillation``, base model, datasets) and the settings evaluation must reuse (prompt template, video layout,
    video settings); ``grounding-rl eval`` on the folder adds an "Evaluation" section (:func:`add_evaluation`).

    Args:
        grounding_config: the :class:`grounding_rl.prompts.preprocessing.GroundingConfig` saved beside it.
        base_model: the model training started from (path or hub id), or None.
        stage: ``"GRPO"``, ``"SFT"`` or ``"distillation"``.
        command: the training command line, or None.
        lora_targets: the LoRA ``target_modules`` of an adapter checkpoint (their text), or None for full weights.
        teacher: the distillation teacher (path or hub id), or None.
        datasets: the training data's sources (:func:`datasets_of`), or None when unknown.
        trackers: one markdown line per tracker of the run (:func:`tracker_lines`), or None.
    """
    video = grounding_config.video.to_dict()
    cell = (lora_targets or "").replace("|", "\\|")  # a "|" inside a table cell, even in code, ends the cell (GFM)
    adapter = ("A LoRA adapter on " + (
        "the language model's attention and MLP projections (q/k/v/o, gate/up/down; the default of `use_peft`); the "
        "vision tower and its merger are not adapted." if lora_targets == DEFAULT_LORA_TARGETS
        else f"the modules `{lora_targets}`.") + " `grounding-rl eval` and `infer` load this folder as it is; "
        "`grounding-rl merge-lora` writes it out as full weights.")
    from huggingface_hub import ModelCard, ModelCardData

    data = ModelCardData(library_name="transformers", pipeline_tag="video-text-to-text", base_model=base_model or None,
                         datasets=datasets or None, tags=["grounding-rl", "video-temporal-grounding", stage.lower()])
    lines = [
        f"# Video temporal grounding model ({stage}, grounding_rl)", "",
        f"Trained with `grounding_rl` ({stage}) from `{base_model or 'unknown'}` to answer when an event happens in a "
        "video: `<think>…</think><answer>start to end</answer>`, times in seconds.", "",
        "| setting | value |", "|---|---|",
        f"| base model | `{base_model or 'unknown'}` |",
        *([f"| teacher | `{teacher}` |"] if teacher else []),
        *([f"| training data | `{', '.join(datasets)}` |"] if datasets else []),
        f"| prompt template | `{grounding_config.prompt_template}` |",
        f"| video layout | `{grounding_config.video_layout}` |",
        *[f"| video {key} | `{value}` |" for key, value in video.items()],
        f"| rewards | `{', '.join(grounding_config.reward_funcs) or 'none (supervised)'}` |",
        f"| reward weights | `{grounding_config.reward_weights}` |",
        *([f"| LoRA target modules | `{cell}` |"] if lora_targets else []), "",
        *([adapter, ""] if lora_targets else []),
        "Evaluate or query it with the same preprocessing (read from `grounding_config.json`):", "",
        "```bash", "grounding-rl eval --model THIS_FOLDER --data test.jsonl --out eval-out",
        "grounding-rl infer --model THIS_FOLDER --video clip.mp4 --query \"person opens the door.\"", "```", "",
    ]
    if trackers:
        lines += ["## Training run", "", *[f"- {line}" for line in trackers], ""]
    if command:
        lines += ["Training command:", "", "```bash", command, "```", ""]
    return ModelCard(f"---\n{data.to_yaml()}\n---\n\n" + "\n".join(lines))


def write_grounding_files(folder: str | Path, grounding_config, base_model: str | None, stage: str,
                          command: str | None, lora_targets: str | None = None, teacher: str | None = None,
                          datasets: list[str] | None = None, trackers: list[str] | None = None) -> None:
    """Write ``grounding_config.json`` and the model card (:func:`model_card`) into ``folder`` (created if needed)."""
    folder = Path(folder)
    grounding_config.save(folder)
    model_card(grounding_config, base_model, stage, command, lora_targets, teacher, datasets,
               trackers).save(folder / MODEL_CARD)


def datasets_of(dataset) -> list[str] | None:
    """The data sets a training set comes from, for the card's ``datasets``: the sorted distinct ``source`` of its
    samples that name a benchmark reader (``charades_sta``, ``activitynet``, ``time_r1``, …,
    :data:`grounding_rl.data.readers.READERS`; the canonical ``jsonl`` and hand-made sources are not data sets), or
    None when none is known."""
    from grounding_rl.data.readers import READERS

    samples = getattr(dataset, "samples", None) or []
    found = sorted({s.get("source") for s in samples if isinstance(s, dict)} & (set(READERS) - {"jsonl"}))
    return found or None


def tracker_lines(args) -> list[str]:
    """One markdown line per tracker the run reports to (``report_to``: ``wandb``, ``trackio``, ``tensorboard``),
    saying where its run is: the wandb run's URL (its name and local folder when offline), the trackio project and
    Space, TensorBoard's event folder; empty without a tracker."""
    import os

    report_to = getattr(args, "report_to", None) or []
    report_to = [report_to] if isinstance(report_to, str) else list(report_to)
    name = getattr(args, "run_name", None)
    lines = []
    if "wandb" in report_to:
        run = getattr(sys.modules.get("wandb"), "run", None)
        url, run_name = getattr(run, "url", None), getattr(run, "name", None) or name
        lines.append(f"Weights & Biases run [{run_name or url}]({url})" if url else
                     f"Weights & Biases run `{run_name or '?'}` (offline: its files are under "
                     f"`{os.environ.get('WANDB_DIR') or 'wandb/'}`; `wandb sync` uploads them)")
    if "trackio" in report_to:
        space = getattr(args, "trackio_space_id", None)
        lines.append(f"Trackio project `{getattr(args, 'project', None)}`" + (f", run `{name}`" if name else "")
                     + (f" on the Space [{space}](https://huggingface.co/spaces/{space})" if space
                        else " (local: `trackio show`)"))
    if "tensorboard" in report_to:
        lines.append("TensorBoard event files under `runs/` of the run folder (`tensorboard --logdir runs`)")
    return lines


EVALUATION = "## Evaluation"


def add_evaluation(model: str | Path, metrics: dict, report: str | Path) -> Path | None:
    """Put ``grounding-rl eval``'s results into the model card of a training run's folder: the card's "Evaluation"
    section gets (or replaces) the subsection of this data (the benchmark's name, else the data file's), with the
    metrics table and the report's path.

    The rule: only a local folder holding ``grounding_config.json`` and a ``README.md`` whose metadata tags include
    ``grounding-rl`` (a card written by this package) and that this user may write; anything else (a hub id, a
    foreign folder) is left alone, and so is a ``checkpoint-N`` with its mark (``checkpoint_complete.json`` lists
    every file's size: a longer card would make it incomplete, :mod:`grounding_rl.update.checkpoints`).

    Args:
        model: eval's ``--model``.
        metrics: the ``metrics.json`` object eval wrote (metrics at its top level, ``data``, ``benchmark``).
        report: the ``report.md`` written beside it.
    Returns:
        the card's path when it was updated, else None.
    """
    import os

    from huggingface_hub import ModelCard

    from grounding_rl.reward.metrics import METRIC_NAMES, SET_METRIC_NAMES, format_metrics_table
    from grounding_rl.update.checkpoints import MARK

    folder = Path(model)
    path = folder / MODEL_CARD
    if not ((folder / "grounding_config.json").is_file() and path.is_file() and os.access(path, os.W_OK)) or \
            (folder / MARK).exists():
        return None
    card = ModelCard.load(path)
    if "grounding-rl" not in (card.data.tags or []):
        return None
    key = metrics.get("benchmark") or Path(str(metrics.get("data"))).name
    table = format_metrics_table({k: metrics[k] for k in METRIC_NAMES + SET_METRIC_NAMES if k in metrics})
    part = f"### {key}\n\n{table}\n\nFrom `grounding-rl eval` ({metrics.get('created', '')}); report: `{report}`\n"
    head, found, rest = card.text.partition(f"\n{EVALUATION}\n")
    if not found:
        head, rest = card.text.rstrip("\n") + "\n", ""
    body, nxt, tail = rest.partition("\n## ")  # the section runs to the next "## " heading
    parts = [p for p in ("\n" + body).split("\n### ")[1:] if p.strip()]
    parts = [f"### {p.strip()}\n" for p in parts if p.split("\n", 1)[0].strip() != str(key)] + [part]
    card.text = f"{head}\n{EVALUATION}\n\n" + "\n".join(parts) + (f"\n## {tail}" if nxt else "")
    card.save(path)
    return path


def lora_targets_of(model) -> str | None:
    """The ``target_modules`` of a PEFT model's active adapter as text (a regular expression, or the sorted names),
    or None for a plain model."""
    configs = getattr(model, "peft_config", None)
    if not configs:
        return None
    active = getattr(model, "active_adapter", None)
    config = configs.get(active if isinstance(active, str) else "default") or next(iter(configs.values()))
    targets = getattr(config, "target_modules", None)
    if targets is None:
        return None
    return targets if isinstance(targets, str) else ", ".join(sorted(targets))


class GroundingSaveMixin:
    """``save_model`` that also writes :func:`write_grounding_files` (every checkpoint and the final folder) and, when
    ``fingerprint`` is set, ``run_fingerprint.json`` (what produced the run; compared on resume), then gives every
    file of the folder the mode ``open()`` would (:func:`grounding_rl.paths.follow_umask`). ``Trainer`` writes the
    optimizer, scheduler and RNG states of a ``checkpoint-N`` after ``save_model`` with ``torch.save``, which follows
    the umask already.

    ``stage`` names the training stage in the card; a trainer's ``reward_func_names`` (what it scores with) replace
    the config's ``reward_funcs`` in ``grounding_config.json``.
    """

    stage = "GRPO"
    command: str | None = None
    fingerprint: dict | None = None  # written as run_fingerprint.json when set (grounding_rl.cli.common)

    def init_hf_repo(self, token: str | None = None, private: bool | None = None) -> None:
        """Trainer's repository creation (``push_to_hub``), its failure one line
        (:func:`grounding_rl.update.hub.create_repo`)."""
        from grounding_rl.update.hub import create_repo

        create_repo(self, token, private)

    def _push_from_checkpoint(self, checkpoint_folder: str) -> None:
        """None: Trainer would push before the checkpoint's mark; :class:`grounding_rl.update.hub.HubPushCallback`
        pushes it once complete."""

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False):
        super().save_model(output_dir, True)  # Trainer's push (before the files below) never: grounding_rl.update.hub
        if self.args.should_save:
            import dataclasses

            from grounding_rl.family import family_of
            from grounding_rl.update.recipes import teacher

            unwrapped = self.accelerator.unwrap_model(self.model)
            base = getattr(unwrapped, "name_or_path", None)
            folder = output_dir or self.args.output_dir
            config = self.args.grounding_config()  # the video settings as sampled: the model family's pixel factor
            config = dataclasses.replace(config, video=family_of(unwrapped).video_settings(config.video),
                                         reward_funcs=getattr(self, "reward_func_names", config.reward_funcs),
                                         data_mix=getattr(self, "data_mix", None) or config.data_mix,
                                         duration_filter=getattr(self, "duration_filter", None))
            write_grounding_files(folder, config, base, self.stage, self.command or training_command(),
                                  lora_targets_of(unwrapped), (teacher(self.args) or (None,))[0],
                                  datasets_of(getattr(self, "train_dataset", None)), tracker_lines(self.args))
            if self.fingerprint is not None:
                write_record(Path(folder) / "run_fingerprint.json", self.fingerprint)
            follow_umask(folder)
