"""``grounding-rl merge-lora --adapter DIR --out DIR [--base MODEL]``: LoRA checkpoint → full merged weights.

The merged folder holds the model, the processor and the adapter's ``grounding_config.json`` and model card, so
``grounding-rl eval`` / ``infer`` and any other engine (vLLM, plain transformers) load it directly.
"""
from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from grounding_rl.errors import UserError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="grounding-rl merge-lora", description=__doc__.splitlines()[0])
    parser.add_argument("--adapter", required=True, help="LoRA checkpoint folder (adapter_config.json)")
    parser.add_argument("--out", required=True, help="output folder for the merged model")
    parser.add_argument("--base", default=None, help="base model (default: the adapter's base_model_name_or_path)")
    parser.add_argument("--dtype", default=None, help="dtype to load the base in (default: the checkpoint's)")
    args = parser.parse_args(argv)
    from grounding_rl.models.loading import merge_lora

    adapter = Path(args.adapter)
    if not (adapter / "adapter_config.json").is_file():
        raise UserError(f"{adapter}: no adapter_config.json (not a LoRA checkpoint)")
    try:
        out = merge_lora(adapter, args.out, base=args.base, dtype=args.dtype)
    except ValueError as err:
        raise UserError(str(err)) from err
    for name in ("grounding_config.json", "README.md"):
        if (adapter / name).is_file():
            shutil.copyfile(adapter / name, out / name)
    print(json.dumps({"merged": str(out), "from": str(adapter)}))
    return 0
