"""``grounding-rl merge-lora --adapter DIR --out DIR [--base MODEL]``: LoRA checkpoint → full merged weights.

The merged folder holds the model, the processor and the adapter's ``grounding_config.json`` and model card, so
``grounding-rl eval`` / ``infer`` and any other engine (vLLM, plain transformers) load it directly. A ``--base`` of
another family or architecture than the adapter was trained on is refused before anything is written
(:func:`check_base`), and so is an ``--out`` that already holds files (a run, the base model: their weights and
config would be overwritten; :func:`grounding_rl.models.loading.merge_lora`).
"""
from __future__ import annotations

import argparse
import json
import re
import shutil
from pathlib import Path

from grounding_rl.errors import UserError


def _read_json(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _base_config(base: str) -> dict | None:
    """The ``config.json`` of a local base folder, else of a hub id through ``AutoConfig`` (None when unreadable:
    the merge then reports why)."""
    if Path(base).is_dir():
        return _read_json(Path(base) / "config.json")
    try:
        from transformers import AutoConfig

        return AutoConfig.from_pretrained(base, trust_remote_code=False).to_dict()
    except (OSError, ValueError):
        return None


def _family(model_type: str | None) -> str | None:
    from grounding_rl.family import family_of

    try:
        return type(family_of(str(model_type))).__name__
    except ValueError:
        return None


def check_base(adapter: Path, base: str) -> None:
    """Refuse a ``--base`` that is not the model the adapter was trained on, from the files alone (before any weights
    load): its ``model_type`` and ``architectures`` against the adapter's recorded base (``base_model_name_or_path``
    of ``adapter_config.json`` when that folder is still here), else its family against the processor class saved with
    the adapter (``processor_class``); and its language model's width and depth against the adapter's LoRA matrices
    (``q_proj.lora_A``: ``[r, hidden_size]``, layer indices below ``num_hidden_layers``).

    Raises:
        UserError: one line naming ``--base``, what it is and what the adapter was trained on.
    """
    config = _base_config(base)
    if config is None:
        return
    text = config.get("text_config") or config
    what = f"{config.get('model_type')} {','.join(config.get('architectures') or [])}".strip()
    recorded = (_read_json(adapter / "adapter_config.json") or {}).get("base_model_name_or_path")
    trained = _read_json(Path(recorded) / "config.json") if recorded and Path(recorded).is_dir() else None
    if trained is not None:
        if (trained.get("model_type"), trained.get("architectures")) != (config.get("model_type"),
                                                                         config.get("architectures")):
            raise UserError(f"--base {base} is a {what} model, but the adapter {adapter} was trained on {recorded} "
                            f"({trained.get('model_type')} {','.join(trained.get('architectures') or [])}); "
                            "merge into the base it was trained on")
    else:
        saved = [(_read_json(adapter / name) or {}).get("processor_class")
                 for name in ("processor_config.json", "tokenizer_config.json", "preprocessor_config.json")]
        saved = next((name for name in saved if name), None)
        if saved is not None and _family(config.get("model_type")) is not None:
            from grounding_rl.family import families

            family = next((type(f).__name__ for f in families() if saved in f.processor_classes), None)
            if family is not None and family != _family(config.get("model_type")):
                raise UserError(f"--base {base} is a {what} model, but the adapter {adapter} was saved with a "
                                f"{saved} (another model family); merge into the base it was trained on")
    weights = adapter / "adapter_model.safetensors"
    if weights.is_file():
        from safetensors import safe_open

        with safe_open(str(weights), framework="pt") as handle:
            shapes = {key: handle.get_slice(key).get_shape() for key in handle.keys()}
        width = next((shape[1] for key, shape in shapes.items()
                      if "language_model" in key and key.endswith("q_proj.lora_A.weight")), None)
        layers = [int(m.group(1)) for key in shapes if "language_model" in key
                  for m in [re.search(r"\.layers\.(\d+)\.", key)] if m]
        if width is not None and text.get("hidden_size") not in (None, width):
            raise UserError(f"--base {base} has hidden_size {text.get('hidden_size')}, but the adapter {adapter} was "
                            f"trained on a model of hidden_size {width}; merge into the base it was trained on")
        if layers and text.get("num_hidden_layers") is not None and max(layers) >= text["num_hidden_layers"]:
            raise UserError(f"--base {base} has {text['num_hidden_layers']} layers, but the adapter {adapter} adapts "
                            f"layer {max(layers)}; merge into the base it was trained on")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="grounding-rl merge-lora", description=(
        "Merge a LoRA checkpoint into full weights: the folder holds the model, the processor and the adapter's "
        "grounding_config.json and model card, for eval, infer, vLLM or plain transformers."))
    parser.add_argument("--adapter", required=True, help="LoRA checkpoint folder (adapter_config.json)")
    parser.add_argument("--out", required=True,
                        help="output folder for the merged model: new or empty (a folder holding files is refused)")
    parser.add_argument("--base", default=None,
                        help="base model (default: the adapter's base_model_name_or_path); one of another family or "
                             "architecture than the adapter was trained on is refused")
    parser.add_argument("--dtype", default=None, choices=("auto", "bfloat16", "float16", "float32"),
                        help="dtype to load the base in (default: the checkpoint's)")
    args = parser.parse_args(argv)
    from grounding_rl.models.loading import merge_lora

    adapter = Path(args.adapter)
    if not (adapter / "adapter_config.json").is_file():
        raise UserError(f"{adapter}: no adapter_config.json (not a LoRA checkpoint)")
    if args.base is not None:
        check_base(adapter, args.base)
    try:
        out = merge_lora(adapter, args.out, base=args.base, dtype=args.dtype)
    except ValueError as err:
        raise UserError(str(err)) from err
    for name in ("grounding_config.json", "README.md"):
        if (adapter / name).is_file():
            shutil.copyfile(adapter / name, out / name)
    print(json.dumps({"merged": str(out), "from": str(adapter)}))
    return 0
