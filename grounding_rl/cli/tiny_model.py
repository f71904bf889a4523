"""``grounding-rl tiny-model``: a random-weight Qwen-VL model small enough for CPU tests and the demo
(:mod:`grounding_rl.dev.tiny`).

    grounding-rl tiny-model --out DIR [--like REAL_MODEL_FOLDER | --tokenizer QWEN2_5_VL_FOLDER] [--hidden-size N ...]
                            [--overwrite]
    grounding-rl tiny-model --from-config CONFIG.yaml [training overrides]

The second form builds the ``tiny_model:`` block a training config names, at its ``model_name_or_path``, when that
folder is missing (``scripts/train.sh`` and ``scripts/demo.sh`` call it). A folder holding files tiny-model did not
write (a training run, a user's files) is refused unless ``--overwrite``; its own earlier model is replaced
(:mod:`grounding_rl.dev.written`).
"""
from __future__ import annotations

import argparse
import json
import sys

from grounding_rl.errors import UserError, check_number


# help for each size flag (defaults: the family's; tiny Qwen2.5-VL: 64 wide, 2 layers; Qwen3-VL: 3 layers, ViT 4)
SIZE_HELP = {
    "hidden_size": "width of the language model (divisible by --num-heads)",
    "num_layers": "language-model layers",
    "num_heads": "attention heads of the language model",
    "num_kv_heads": "key/value heads of the language model (divides --num-heads)",
    "intermediate_size": "width of the language model's MLP",
    "vision_hidden_size": "width of the vision tower (divisible by --vision-heads)",
    "vision_depth": "vision-tower blocks",
    "vision_heads": "attention heads of the vision tower",
}


def main(argv: list[str] | None = None) -> int:
    from grounding_rl.dev.tiny import SIZE_KEYS, build_tiny_model, ensure_from_config

    argv = list(argv or [])
    if argv[:1] == ["--from-config"] or (argv[:1] and argv[0].startswith("--from-config=")):
        config = argv[0].split("=", 1)[1] if "=" in argv[0] else (argv[1] if len(argv) > 1 else None)
        if not config:
            raise UserError("--from-config needs a training config (grounding-rl tiny-model --from-config CONFIG "
                            "[training overrides])")
        ensure_from_config(config, argv[1:] if "=" in argv[0] else argv[2:])
        return 0
    parser = argparse.ArgumentParser(prog="grounding-rl tiny-model",
                                     description="Build a random-weight tiny Qwen-VL model for tests and the demo.")
    parser.add_argument("--out", required=True,
                        help="output folder; refused when it holds files tiny-model did not write (a training run, "
                             "your own) unless --overwrite; its own earlier model (tiny_model.json) is replaced")
    parser.add_argument("--overwrite", action="store_true",
                        help="write over a folder holding other files (they are left beside the new model)")
    parser.add_argument("--from-config", metavar="CONFIG",
                        help="(first argument, followed by training overrides) build the `tiny_model:` a training "
                             "config names at its model_name_or_path when that folder is missing")
    parser.add_argument("--like", help="a real model folder (config.json, processor, tokenizer, chat template), e.g. "
                                       "../shared/models/Qwen3-VL-8B-Instruct: its architecture at tiny size")
    parser.add_argument("--tokenizer", help="Qwen2.5-VL tokenizer/processor folder for a tiny Qwen2.5-VL "
                                            "(default without --like: train a small BPE; with --like only 'local')")
    for key in SIZE_KEYS:
        parser.add_argument("--" + key.replace("_", "-"), type=int, default=None,
                            help=SIZE_HELP[key] + " (default: the family's tiny size)")
    parser.add_argument("--seed", type=int, default=0, help="torch seed of the random weights")
    args = parser.parse_args(argv)
    if args.from_config:
        raise UserError("--from-config comes first and alone: grounding-rl tiny-model --from-config CONFIG "
                        "[training overrides]")
    for key in SIZE_KEYS:
        check_number("--" + key.replace("_", "-"), getattr(args, key), minimum=1)
    sizes = {k: getattr(args, k) for k in SIZE_KEYS}
    out = build_tiny_model(args.out, tokenizer=args.tokenizer, seed=args.seed, like=args.like,
                           overwrite=args.overwrite, **sizes)
    from safetensors.torch import load_file

    n = sum(p.numel() for p in load_file(str(out / "model.safetensors")).values())
    print(json.dumps({"out": str(out), "parameters": n}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
