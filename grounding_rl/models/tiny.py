"""``grounding-rl tiny-model``: a random-weight Qwen2.5-VL small enough for CPU tests and the demo.

The architecture is the real one (``Qwen2_5_VLForConditionalGeneration``: windowed ViT, patch merger, 3D RoPE), only
narrow and shallow. Saved with ``save_pretrained`` so ``AutoProcessor`` / ``AutoModelForImageTextToText`` reload it
offline.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

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


def tiny_config(vocab_size: int, token_ids: dict, hidden_size: int = 64, num_layers: int = 2, num_heads: int = 4,
                num_kv_heads: int = 2, intermediate_size: int = 128, vision_hidden_size: int = 32,
                vision_depth: int = 2, vision_heads: int = 2, tie_word_embeddings: bool = True):
    """A ``Qwen2_5_VLConfig`` with the real model's structure at tiny width and depth.

    ``mrope_section`` keeps the real model's 1:1.5:1.5 split of the rotary half-dimension (16, 24, 24 of 64) scaled to
    ``head_dim / 2``. The vision tower keeps window attention with its last block global (like blocks 7/15/23/31 of
    the real one), ``tokens_per_second`` 2 and temporal patch 2.

    Raises:
        ValueError: hidden_size not divisible by num_heads, or head_dim / 2 < 4.
    """
    from transformers import Qwen2_5_VLConfig

    if hidden_size % num_heads:
        raise ValueError(f"hidden_size {hidden_size} is not divisible by num_heads {num_heads}")
    half = hidden_size // num_heads // 2
    if half < 4:
        raise ValueError(f"head_dim {hidden_size // num_heads} too small for 3D RoPE (need ≥ 8)")
    t = max(1, round(half * 16 / 64))
    h = (half - t) // 2
    mrope = [t, h, half - t - h]
    text = dict(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=32768,
        rope_theta=1000000.0,
        rope_scaling={"type": "mrope", "rope_type": "default", "mrope_section": mrope},
        rms_norm_eps=1e-6,
        tie_word_embeddings=tie_word_embeddings,
        bos_token_id=token_ids["bos_token_id"],
        eos_token_id=token_ids["eos_token_id"],
        pad_token_id=token_ids["pad_token_id"],
    )
    vision = dict(
        depth=vision_depth,
        hidden_size=vision_hidden_size,
        intermediate_size=vision_hidden_size * 2,
        num_heads=vision_heads,
        out_hidden_size=hidden_size,
        patch_size=14,
        spatial_merge_size=2,
        temporal_patch_size=2,
        window_size=112,
        fullatt_block_indexes=[vision_depth - 1],
        tokens_per_second=2,
    )
    return Qwen2_5_VLConfig(
        text_config=text,
        vision_config=vision,
        tie_word_embeddings=tie_word_embeddings,
        **{k: v for k, v in token_ids.items() if k not in ("bos_token_id", "eos_token_id", "pad_token_id")},
        bos_token_id=token_ids["bos_token_id"],
        eos_token_id=token_ids["eos_token_id"],
        pad_token_id=token_ids["pad_token_id"],
    )


def build_tiny_model(out: str | Path, tokenizer: str | Path | None = None, seed: int = 0, **sizes) -> Path:
    """Build and save a random-weight tiny Qwen2.5-VL and its processor into ``out``.

    Args:
        out: output directory (created).
        tokenizer: a folder with Qwen2.5-VL tokenizer/processor files (e.g. ``../shared/models/Qwen2.5-VL-7B-Instruct``);
            None trains a small byte-level BPE tokenizer locally (:mod:`grounding_rl.models.tiny_tokenizer`).
        seed: torch seed for the random weights.
        sizes: overrides for :func:`tiny_config` (hidden_size, num_layers, ...).

    Returns:
        The output directory.
    """
    from transformers import AutoProcessor, GenerationConfig, Qwen2_5_VLForConditionalGeneration

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if tokenizer is not None:
        processor = AutoProcessor.from_pretrained(str(tokenizer))
        token_ids = dict(QWEN_TOKEN_IDS)
        vocab_size = len(processor.tokenizer)
    else:
        from grounding_rl.models.tiny_tokenizer import build_processor

        processor = build_processor()
        token_ids = processor.token_ids
        vocab_size = len(processor.tokenizer)
    vocab_size = (vocab_size + 63) // 64 * 64
    torch.manual_seed(seed)
    config = tiny_config(vocab_size, token_ids, **sizes)
    model = Qwen2_5_VLForConditionalGeneration(config).eval()
    model.generation_config = GenerationConfig(
        bos_token_id=token_ids["bos_token_id"],
        eos_token_id=[token_ids["eos_token_id"], token_ids["pad_token_id"]],
        pad_token_id=token_ids["pad_token_id"],
    )
    model.save_pretrained(out)
    processor.save_pretrained(out)
    return out


SIZE_KEYS = ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "intermediate_size", "vision_hidden_size",
             "vision_depth", "vision_heads")


def ensure_from_config(config_path: str | Path, overrides: list[str] | None = None) -> Path | None:
    """Build the tiny model a training config names, when its directory is missing.

    A config may hold ``tiny_model: {tokenizer: DIR, hidden_size: 64, ...}`` (keys of :func:`tiny_config` plus
    ``tokenizer`` and ``seed``) next to ``model_name_or_path``. ``--model_name_or_path X`` in ``overrides`` wins.

    Returns:
        The model directory when the config names a tiny model, else None.

    Raises:
        ValueError: ``tiny_model`` is not a mapping or has unknown keys (names the config).
    """
    import yaml

    from grounding_rl.paths import resolve_config_path

    config = yaml.safe_load(Path(config_path).read_text()) or {}
    spec = config.get("tiny_model")
    if spec is None:
        return None
    if not isinstance(spec, dict) or set(spec) - {"tokenizer", "seed", *SIZE_KEYS}:
        raise ValueError(f"{config_path}: tiny_model must be a mapping of tokenizer, seed and {', '.join(SIZE_KEYS)}")
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
    tokenizer = resolve_config_path(spec.get("tokenizer")) if spec.get("tokenizer") else None
    sizes = {k: spec[k] for k in SIZE_KEYS if k in spec}
    print(f"tiny-model: building {out} (tokenizer: {tokenizer or 'trained locally'})", flush=True)
    return build_tiny_model(out, tokenizer=tokenizer, seed=int(spec.get("seed", 0)), **sizes)


def main(argv: list[str] | None = None) -> int:
    argv = list(argv or [])
    if argv[:1] == ["--from-config"]:
        if len(argv) < 2:
            print("usage: grounding-rl tiny-model --from-config CONFIG [training overrides]")
            return 2
        ensure_from_config(argv[1], argv[2:])
        return 0
    parser = argparse.ArgumentParser(prog="grounding-rl tiny-model", description=__doc__.splitlines()[0],
                                     epilog="Or: --from-config CONFIG builds the `tiny_model:` a training config "
                                            "names when its model_name_or_path is missing.")
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument("--tokenizer", help="Qwen2.5-VL tokenizer/processor folder (default: train a small BPE)")
    parser.add_argument("--hidden-size", type=int, default=64)
    parser.add_argument("--num-layers", type=int, default=2)
    parser.add_argument("--num-heads", type=int, default=4)
    parser.add_argument("--num-kv-heads", type=int, default=2)
    parser.add_argument("--intermediate-size", type=int, default=128)
    parser.add_argument("--vision-hidden-size", type=int, default=32)
    parser.add_argument("--vision-depth", type=int, default=2)
    parser.add_argument("--vision-heads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    sizes = {k: getattr(args, k) for k in SIZE_KEYS}
    out = build_tiny_model(args.out, tokenizer=args.tokenizer, seed=args.seed, **sizes)
    n = sum(p.numel() for p in __import__("safetensors.torch", fromlist=["load_file"]).load_file(
        str(out / "model.safetensors")).values())
    print(json.dumps({"out": str(out), "parameters": n}))
    return 0
