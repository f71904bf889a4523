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


def training_command(argv: list[str] | None = None) -> str:
    """The command line of this run, quoted for a shell (``grounding-rl <subcommand> …``)."""
    argv = list(sys.argv if argv is None else argv)
    return " ".join(shlex.quote(a) for a in argv)


def model_card(grounding_config, base_model: str | None, stage: str, command: str | None,
               lora_targets: str | None = None, teacher: str | None = None):
    """The ``README.md`` of a checkpoint, a ``huggingface_hub.ModelCard``: its Hub metadata (``ModelCardData``: library,
    pipeline tag, tags, base model) and the settings evaluation must reuse.

    Args:
        grounding_config: the :class:`grounding_rl.prompts.preprocessing.GroundingConfig` saved beside it.
        base_model: the model training started from (path or hub id), or None.
        stage: ``"GRPO"``, ``"SFT"`` or ``"distillation"``.
        command: the training command line, or None.
        lora_targets: the LoRA ``target_modules`` of an adapter checkpoint (their text), or None for full weights.
        teacher: the distillation teacher (path or hub id), or None.
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
                         tags=["grounding-rl", "video-temporal-grounding", stage.lower()])
    lines = [
        f"# Video temporal grounding model ({stage}, grounding_rl)", "",
        f"Trained with `grounding_rl` ({stage}) from `{base_model or 'unknown'}` to answer when an event happens in a "
        "video: `<think>…</think><answer>start to end</answer>`, times in seconds.", "",
        "| setting | value |", "|---|---|",
        f"| base model | `{base_model or 'unknown'}` |",
        *([f"| teacher | `{teacher}` |"] if teacher else []),
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
    if command:
        lines += ["Training command:", "", "```bash", command, "```", ""]
    return ModelCard(f"---\n{data.to_yaml()}\n---\n\n" + "\n".join(lines))


def write_grounding_files(folder: str | Path, grounding_config, base_model: str | None, stage: str,
                          command: str | None, lora_targets: str | None = None, teacher: str | None = None) -> None:
    """Write ``grounding_config.json`` and the model card (:func:`model_card`) into ``folder`` (created if needed)."""
    folder = Path(folder)
    grounding_config.save(folder)
    model_card(grounding_config, base_model, stage, command, lora_targets, teacher).save(folder / MODEL_CARD)


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

    ``grounding_config()`` defaults to the ``args``' own; ``stage`` names the training stage in the card.
    """

    stage = "GRPO"
    command: str | None = None
    fingerprint: dict | None = None  # written as run_fingerprint.json when set (grounding_rl.cli.common)

    def grounding_config(self):
        """What evaluation and inference must reuse."""
        return self.args.grounding_config()

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False):
        super().save_model(output_dir, _internal_call)
        if self.args.should_save:
            import dataclasses

            from grounding_rl.family import family_of

            unwrapped = self.accelerator.unwrap_model(self.model)
            base = getattr(unwrapped, "name_or_path", None)
            folder = output_dir or self.args.output_dir
            config = self.grounding_config()  # the video settings as sampled: with the model family's pixel factor
            config = dataclasses.replace(config, video=family_of(unwrapped).video_settings(config.video),
                                         data_mix=getattr(self, "data_mix", None) or config.data_mix,
                                         duration_filter=getattr(self, "duration_filter", None))
            write_grounding_files(folder, config, base, self.stage, self.command or training_command(),
                                  lora_targets_of(unwrapped), getattr(self.args, "teacher_model_name_or_path", None))
            if self.fingerprint is not None:
                write_record(Path(folder) / "run_fingerprint.json", self.fingerprint)
            follow_umask(folder)
