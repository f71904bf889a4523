"""``grounding-rl tiny-model``: a random-weight Qwen-VL model small enough for CPU tests and the demo
(:mod:`grounding_rl.dev.tiny`).

    grounding-rl tiny-model --out DIR [--like REAL_MODEL_FOLDER | --tokenizer QWEN2_5_VL_FOLDER] [--hidden-size N ...]
    grounding-rl tiny-model --from-config CONFIG.yaml [training overrides]

The second form builds the ``tiny_model:`` block a training config names, at its ``model_name_or_path``, when that
folder is missing (``scripts/train.sh`` and ``scripts/demo.sh`` call it).
"""
from __future__ import annotations

import argparse
import json
import sys


def main(argv: list[str] | None = None) -> int:
    from grounding_rl.dev.tiny import SIZE_KEYS, build_tiny_model, ensure_from_config

    argv = list(argv or [])
    if argv[:1] == ["--from-config"]:
        if len(argv) < 2:
            print("usage: grounding-rl tiny-model --from-config CONFIG [training overrides]")
            return 2
        ensure_from_config(argv[1], argv[2:])
        return 0
    parser = argparse.ArgumentParser(prog="grounding-rl tiny-model",
                                     description="Build a random-weight tiny Qwen-VL model for tests and the demo.",
                                     epilog="Or: --from-config CONFIG builds the `tiny_model:` a training config "
                                            "names when its model_name_or_path is missing.")
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument("--like", help="a real model folder (config.json, processor, tokenizer, chat template), e.g. "
                                       "../shared/models/Qwen3-VL-8B-Instruct: its architecture at tiny size")
    parser.add_argument("--tokenizer", help="Qwen2.5-VL tokenizer/processor folder for a tiny Qwen2.5-VL "
                                            "(default without --like: train a small BPE)")
    for key in SIZE_KEYS:  # defaults: the family's (tiny Qwen2.5-VL: 64 wide, 2 layers; Qwen3-VL: 3 layers, ViT 4)
        parser.add_argument("--" + key.replace("_", "-"), type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    sizes = {k: getattr(args, k) for k in SIZE_KEYS}
    out = build_tiny_model(args.out, tokenizer=args.tokenizer, seed=args.seed, like=args.like, **sizes)
    from safetensors.torch import load_file

    n = sum(p.numel() for p in load_file(str(out / "model.safetensors")).values())
    print(json.dumps({"out": str(out), "parameters": n}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
