"""Random-weight Qwen-VL models small enough for CPU tests and the demo (a development tool; the command is
``grounding-rl tiny-model``, :mod:`grounding_rl.cli.tiny_model`).

``--like FOLDER`` takes a real model folder's tokenizer, processor, chat template and architecture (its
``config.json``; Qwen2.5-VL: windowed ViT, patch merger, 3D RoPE; Qwen3-VL: DeepStack mergers, interleaved 3D RoPE,
also the MoE variant) and builds it narrow and shallow (the family's ``tiny_config``, :mod:`grounding_rl.family`).
``--tokenizer FOLDER`` (a Qwen2.5-VL processor folder) and no option (a locally trained BPE tokenizer) build a tiny
Qwen2.5-VL. Saved with ``save_pretrained`` so ``AutoProcessor`` / ``AutoModelForImageTextToText`` reload it offline.
"""
from __future__ import annotations

import re
from pathlib import Path

import torch

from grounding_rl.family import family_of
from grounding_rl.family.qwen2_5_vl import QWEN2_5_VL
from grounding_rl.paths import follow_umask

# Qwen2.5-VL special token ids (../shared/models/Qwen2.5-VL-7B-Instruct/config.json).
QWEN_TOKEN_IDS = dict(
    bos_token_id=151643,
    eos_token_id=151645,
    pad_token_id=151643,
    vision_start_token_id=151652,
    vision_end_token_id=151653,
    image_token_id=151655,
    video_token_id=151656,
)


def tiny_config(vocab_size: int, token_ids: dict, **sizes):
    """A tiny ``Qwen2_5_VLConfig`` (:meth:`grounding_rl.family.qwen2_5_vl.Qwen25VLFamily.tiny_config`)."""
    return QWEN2_5_VL.tiny_config(vocab_size, token_ids, **sizes)


RECORD = "tiny_model.json"  # what build_tiny_model wrote into its folder (grounding_rl.dev.written)


def check_like(like: str | Path) -> None:
    """Refuse a ``--like`` that is no model folder of a supported family, from its ``config.json`` alone.

    Raises:
        UserError: ``like`` is missing, a file, a folder without a readable ``config.json``, or of an unsupported
            ``model_type`` (names the folder).
    """
    import json

    from grounding_rl.errors import UserError

    folder = Path(like)
    if folder.is_file():
        raise UserError(f"--like {like}: a file, not a model folder (config.json, tokenizer and processor files)")
    if not (folder / "config.json").is_file():
        raise UserError(f"--like {like}: not a model folder (no config.json)")
    try:
        model_type = json.loads((folder / "config.json").read_text(encoding="utf-8")).get("model_type")
        family_of(str(model_type))
    except (ValueError, AttributeError) as err:
        raise UserError(f"--like {folder / 'config.json'}: not a supported model config "
                        f"({str(err).splitlines()[0] if str(err) else 'no model_type'})") from None


def build_tiny_model(out: str | Path, tokenizer: str | Path | None = None, seed: int = 0,
                     like: str | Path | None = None, overwrite: bool = False, **sizes) -> Path:
    """Build and save a random-weight tiny Qwen-VL model and its processor into ``out``.

    Args:
        out: output directory (created).
        tokenizer: a folder with Qwen2.5-VL tokenizer/processor files (e.g.
            ``../shared/models/Qwen2.5-VL-7B-Instruct``);
            None (and no ``like``) trains a small byte-level BPE tokenizer locally
            (:mod:`grounding_rl.dev.tiny_tokenizer`). Builds a tiny Qwen2.5-VL.
        seed: torch seed for the random weights.
        like: a real model folder (``config.json`` plus processor, tokenizer and chat template files, e.g.
            ``../shared/models/Qwen3-VL-8B-Instruct``): its family and architecture at tiny size, with its processor.
            With ``tokenizer="local"`` the processor keeps ``like``'s image/video settings and chat template around
            a locally trained BPE tokenizer (a small vocabulary, as the demo's); any other ``tokenizer`` beside
            ``like`` is refused.
        overwrite: write over a folder holding files this function did not write (:mod:`grounding_rl.dev.written`;
            its own earlier output, listed in ``tiny_model.json``, is replaced without it).
        sizes: overrides for the family's ``tiny_config`` (hidden_size, num_layers, ...; None values ignored).

    Returns:
        The output directory.

    Raises:
        UserError: ``like`` is no model folder of a supported family (:func:`check_like`); ``tokenizer`` other than
            ``"local"`` beside ``like``; sizes the family rejects (hidden size not divisible by the heads, ...);
            ``out`` holds files of something else (a training run, a user's) and ``overwrite`` is false. All before
            anything is written.
    """
    from transformers import AutoConfig, AutoModelForImageTextToText, AutoProcessor, GenerationConfig

    from grounding_rl.dev.written import claim_folder, record_folder
    from grounding_rl.errors import UserError

    out = Path(out)
    sizes = {k: v for k, v in sizes.items() if v is not None}
    if like is not None:
        check_like(like)
        if tokenizer is not None and str(tokenizer) != "local":
            raise UserError(f"--tokenizer {tokenizer} beside --like {like}: the tiny model takes --like's tokenizer "
                            "and processor; drop one of the two (or --tokenizer local for a small trained BPE)")
    real = None
    if like is not None:
        real = AutoConfig.from_pretrained(str(like), trust_remote_code=False)
        family = family_of(real)
        processor = AutoProcessor.from_pretrained(str(like), trust_remote_code=False)
        if str(tokenizer) == "local":
            from grounding_rl.dev.tiny_tokenizer import build_processor

            processor = build_processor(like=processor)
            token_ids = processor.token_ids
        else:
            text = getattr(real, "text_config", real)
            token_ids = dict(
                bos_token_id=getattr(text, "bos_token_id", None) or QWEN_TOKEN_IDS["bos_token_id"],
                eos_token_id=_first(getattr(text, "eos_token_id", None)) or QWEN_TOKEN_IDS["eos_token_id"],
                pad_token_id=processor.tokenizer.pad_token_id or QWEN_TOKEN_IDS["pad_token_id"],
                **{k: getattr(real, k) for k in ("vision_start_token_id", "vision_end_token_id", "image_token_id",
                                                 "video_token_id")},
            )
    elif tokenizer is not None:
        family = QWEN2_5_VL
        processor = AutoProcessor.from_pretrained(str(tokenizer))
        token_ids = dict(QWEN_TOKEN_IDS)
    else:
        from grounding_rl.dev.tiny_tokenizer import build_processor

        family = QWEN2_5_VL
        processor = build_processor()
        token_ids = processor.token_ids
    vocab_size = (len(processor.tokenizer) + 63) // 64 * 64
    torch.manual_seed(seed)
    try:
        config = family.tiny_config(vocab_size, token_ids, like=real, **sizes)
    except ValueError as err:  # the size flags as written: "--hidden-size 64 is not divisible by --num-heads 3"
        message = str(err)
        for key in SIZE_KEYS:
            message = re.sub(rf"\b{key}\b", "--" + key.replace("_", "-"), message)
        raise UserError(message) from None
    before = claim_folder(out, RECORD, overwrite, "tiny-model")
    out.mkdir(parents=True, exist_ok=True)
    model = AutoModelForImageTextToText.from_config(config).eval()
    model.generation_config = GenerationConfig(
        bos_token_id=token_ids["bos_token_id"],
        eos_token_id=[token_ids["eos_token_id"], token_ids["pad_token_id"]],
        pad_token_id=token_ids["pad_token_id"],
    )
    model.save_pretrained(out)
    processor.save_pretrained(out)
    record_folder(out, RECORD, "grounding-rl tiny-model", before)
    follow_umask(out)  # safetensors writes 0600
    return out


def _first(value):
    return value[0] if isinstance(value, (list, tuple)) else value


SIZE_KEYS = ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "intermediate_size", "vision_hidden_size",
             "vision_depth", "vision_heads")


def ensure_from_config(config_path: str | Path, overrides: list[str] | None = None) -> Path | None:
    """Build the tiny model a training config names, when its directory is missing.

    A config may hold ``tiny_model: {like: DIR, hidden_size: 64, ...}`` (the size keys of the family's
    ``tiny_config`` plus ``like``, ``tokenizer`` and ``seed``; see :func:`build_tiny_model`) next to
    ``model_name_or_path``. ``--model_name_or_path X`` in ``overrides`` wins.

    Returns:
        The model directory when the config names a tiny model, else None.

    Raises:
        ValueError: ``tiny_model`` is not a mapping or has unknown keys (names the config).
    """
    from grounding_rl.paths import resolve_config_path
    from grounding_rl.yaml_files import load_yaml

    config = load_yaml(config_path) or {}
    spec = config.get("tiny_model")
    if spec is None:
        return None
    if not isinstance(spec, dict) or set(spec) - {"like", "tokenizer", "seed", *SIZE_KEYS}:
        raise ValueError(f"{config_path}: tiny_model must be a mapping of like, tokenizer, seed and "
                         f"{', '.join(SIZE_KEYS)}")
    target = config.get("model_name_or_path")
    overrides = list(overrides or [])
    for i, arg in enumerate(overrides):
        if arg == "--model_name_or_path" and i + 1 < len(overrides):
            target = overrides[i + 1]
        elif arg.startswith("--model_name_or_path="):
            target = arg.split("=", 1)[1]
    out = Path(resolve_config_path(target))
    if (out / "config.json").is_file():
        return out
    tokenizer = spec.get("tokenizer")
    tokenizer = resolve_config_path(tokenizer) if tokenizer and tokenizer != "local" else tokenizer
    like = resolve_config_path(spec.get("like")) if spec.get("like") else None
    sizes = {k: spec[k] for k in SIZE_KEYS if k in spec}
    print(f"tiny-model: building {out} (like: {like or '-'}, tokenizer: {tokenizer or like or 'trained locally'})",
          flush=True)
    return build_tiny_model(out, tokenizer=tokenizer, seed=int(spec.get("seed", 0)), like=like, **sizes)
