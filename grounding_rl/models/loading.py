"""Load the policy, the reference model and the processor of a Qwen-VL checkpoint (``trust_remote_code`` off).

Under DeepSpeed ZeRO-3 the ``TrainingArguments`` must exist before these calls (they register the DeepSpeed config
that makes ``from_pretrained`` load the weights partitioned); :mod:`grounding_rl.cli.train` parses them first.
"""
from __future__ import annotations

import contextlib
import json
import logging
import re
from pathlib import Path

import torch

from grounding_rl.errors import UserError

logger = logging.getLogger(__name__)

# The LoRA target of ``use_peft`` without ``lora_target_modules`` (:func:`grounding_rl.cli.common.load_training_model`;
# stated in the model card): the language model's attention and MLP projections in every Qwen-VL family
# (``model.language_model.layers.N.self_attn.q_proj`` ...), not the vision tower's (Qwen2.5-VL has
# ``model.visual.blocks.N.mlp.gate_proj`` too) nor its mergers. A regular expression, which PEFT matches against each
# module's full name (``LoraConfig.target_modules`` as a string: ``re.fullmatch``).
DEFAULT_LORA_TARGETS = (r"model\.language_model\.layers\.\d+\.(self_attn\.(q_proj|k_proj|v_proj|o_proj)"
                        r"|mlp\.(gate_proj|up_proj|down_proj))")  # the LoRA recipes' configs/*_lora_*.yaml

# What k-bit loading leaves unquantized (BitsAndBytesConfig.llm_int8_skip_modules): the vision tower with its patch
# merger (and Qwen3-VL's DeepStack mergers), ``model.visual`` in both families, and the output head. transformers
# 5.24 matches a pattern from the start of a module's full name up to a dot, or as its suffix
# (quantizers_utils.should_convert_module); "visual" is the name under older layouts (``visual.blocks.N``).
KBIT_SKIP_MODULES = ("model.visual", "visual", "lm_head")


def kbit_unavailable() -> str | None:
    """Why k-bit loading cannot run here (no CUDA device, or bitsandbytes not installed), else None."""
    import importlib.util

    missing = [what for what, ok in (("CUDA device", torch.cuda.is_available()),
                                     ("bitsandbytes", importlib.util.find_spec("bitsandbytes") is not None)) if not ok]
    return None if not missing else f"here: no {' and no '.join(missing)}"


def kbit_device_map() -> dict:
    """``from_pretrained``'s ``device_map`` for k-bit loading: the whole model on this process's GPU, ``{"":
    local_process_index}`` (what ``trl.get_kbit_device_map`` returned before TRL 1.x dropped it; bitsandbytes
    quantizes on the device it loads to)."""
    from accelerate import PartialState

    return {"": PartialState().local_process_index}


def quantization_config(model_args):
    """The ``BitsAndBytesConfig`` of ``trl.ModelConfig``'s ``load_in_4bit`` / ``load_in_8bit`` (and ``bnb_*``)
    fields, None without either: ``trl.get_quantization_config`` (TRL 1.16 ``trl/trainer/utils.py``), with the vision
    tower, its mergers and ``lm_head`` left unquantized (:data:`KBIT_SKIP_MODULES`) and, for 4-bit, the compute dtype
    ``dtype`` (bfloat16 when ``dtype`` is None or ``"auto"``, which bitsandbytes cannot take). Builds the config only;
    loading it needs CUDA and bitsandbytes (:func:`kbit_unavailable`); ``trl.ModelConfig`` refuses both bit widths at
    once."""
    import copy

    from trl import get_quantization_config

    if not (model_args.load_in_4bit or model_args.load_in_8bit):
        return None
    model_args = copy.copy(model_args)
    if model_args.dtype in (None, "auto"):
        model_args.dtype = "bfloat16"
    config = get_quantization_config(model_args)
    config.llm_int8_skip_modules = list(KBIT_SKIP_MODULES)
    return config


_DTYPES = {"auto": "auto", "bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32, None: None}


def _dtype(name):
    if name not in _DTYPES:
        raise ValueError(f"dtype must be one of {sorted(k for k in _DTYPES if k)}, got {name!r}")
    return _DTYPES[name]


def check_model_folder(path, revision: str | None = None) -> None:
    """Refuse, before anything loads, a model path that names no checkpoint (:func:`check_model_source`) and a folder
    holding both full weights (``model*.safetensors``, ``pytorch_model*.bin``) and a LoRA adapter
    (``adapter_config.json``, ``adapter_model.*``): ``from_pretrained`` would load the full weights and inject the
    adapter on top, a model no run trained (e.g. two runs written into one folder).

    Raises:
        UserError: names the path (and, for the second, one file of each kind).
    """
    check_model_source(path, revision)
    folder = Path(path)
    if not folder.is_dir():
        return
    full = sorted(p.name for pattern in ("model*.safetensors", "pytorch_model*.bin") for p in folder.glob(pattern))
    adapter = [name for name in ("adapter_config.json", "adapter_model.safetensors", "adapter_model.bin")
               if (folder / name).is_file()]
    if full and adapter:
        raise UserError(f"{folder} holds both full weights ({full[0]}) and a LoRA adapter ({adapter[0]}), which would "
                        "load together as a model no run trained; keep one kind per folder (train with a new "
                        "--output_dir or --replace_output_dir true)")


def check_model_source(path, revision: str | None = None) -> None:
    """Refuse, in one line, a ``--model`` / ``model_name_or_path`` that cannot name a checkpoint, before anything loads.

    A local path must be a folder holding ``config.json`` (full weights) or ``adapter_config.json`` (a LoRA output);
    a folder of ``checkpoint-N`` folders alone (a run stopped before its final save) is named with its latest one. A
    path that does not exist passes only when it has the form of a Hub id (``org/name``, as
    ``huggingface_hub.utils.validate_repo_id`` checks) and, offline (``HF_HUB_OFFLINE``), is in the local Hub cache;
    online, transformers fetches it and :func:`load_policy` turns its refusal into one line.

    Raises:
        UserError: ``"outputs/typo: no such checkpoint folder ..."`` and the like, naming the path.
    """
    folder = Path(path).expanduser()
    if folder.is_dir():
        if (folder / "config.json").is_file() or (folder / "adapter_config.json").is_file():
            return
        checkpoints = sorted((p for p in folder.glob("checkpoint-*") if p.is_dir() and p.name[11:].isdigit()),
                             key=lambda p: int(p.name[11:]))
        hint = (f"; its latest checkpoint is {checkpoints[-1]}" if checkpoints else
                "; give a run's output_dir or one of its checkpoint-N folders")
        raise UserError(f"{path}: not a checkpoint folder (no config.json or adapter_config.json){hint}")
    if folder.exists():
        raise UserError(f"{path}: a file, not a checkpoint folder (a folder with config.json)")
    from huggingface_hub import constants, try_to_load_from_cache
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(str(path))
    except HFValidationError:
        raise UserError(f"{path}: no such checkpoint folder") from None
    if constants.HF_HUB_OFFLINE and not any(
            isinstance(try_to_load_from_cache(str(path), name, revision=revision), str)
            for name in ("config.json", "adapter_config.json")):
        raise UserError(f"{path}: no such checkpoint folder, and no Hub model of that id in the local cache "
                        "(HF_HUB_OFFLINE is set)")


def load_processor(path: str, revision: str | None = None):
    """``AutoProcessor.from_pretrained(path)`` with remote code disabled (:func:`check_model_folder` first).

    Raises:
        UserError: a path that names no checkpoint, a folder holding full weights and an adapter.
    """
    from transformers import AutoProcessor

    check_model_folder(path, revision)
    return AutoProcessor.from_pretrained(path, revision=revision, trust_remote_code=False)


def load_policy(path: str, dtype: str | None = None, attn_implementation: str | None = None,
                revision: str | None = None, quantization_config=None, device_map=None):
    """The trainable policy: ``AutoModelForImageTextToText.from_pretrained`` (any family of
    :mod:`grounding_rl.family`), remote code disabled.

    A broken local checkpoint is refused in one line naming the file, before transformers reads it where it can be
    (:func:`check_weight_files`: a shard missing, a truncated or unreadable safetensors file), else from the error
    transformers raises (weights whose shapes do not match ``config.json``; its load report is then not printed).

    Args:
        path: local folder or hub id (offline runs need a local folder).
        dtype: ``"bfloat16"``, ``"float16"``, ``"float32"``, ``"auto"`` or None (transformers' default: the
            checkpoint's dtype).
        attn_implementation: e.g. ``"sdpa"``, ``"flash_attention_2"``; None = library default.
        revision: hub revision.
        quantization_config: a ``BitsAndBytesConfig`` (:func:`quantization_config`) or None.
        device_map: ``from_pretrained``'s (k-bit loading: ``trl.get_kbit_device_map()``) or None.

    Raises:
        UserError: a path that names no checkpoint or a folder holding full weights and an adapter
            (:func:`check_model_folder`); a Hub id the Hub refuses (from transformers' error).
    """
    from transformers import AutoModelForImageTextToText

    check_model_folder(path, revision)
    kwargs = {"trust_remote_code": False, "revision": revision}
    if quantization_config is not None:
        kwargs.update(quantization_config=quantization_config, device_map=device_map)
    if dtype is not None:
        kwargs["dtype"] = _dtype(dtype)
    if attn_implementation is not None:
        kwargs["attn_implementation"] = attn_implementation
    check_weight_files(path)
    with _load_report_held() as held:
        try:
            return AutoModelForImageTextToText.from_pretrained(path, **kwargs)
        except OSError as err:
            if Path(path).expanduser().exists() or getattr(err, "filename", None) is not None:
                raise
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise UserError(f"{path}: no such checkpoint folder, and the Hub did not give it ({first})") from None
        except RuntimeError as err:
            broken = _broken_weights(path, str(err), held)
            if broken is None:
                raise
            held.clear()
            raise broken from None


WEIGHT_INDEX = "model.safetensors.index.json"
WEIGHT_FILES = ("model.safetensors", "adapter_model.safetensors")


def check_weight_files(path) -> None:
    """Check the safetensors files of a local checkpoint folder before anything loads them: every shard that
    ``model.safetensors.index.json`` names exists, and the header of every weight file (``model.safetensors``, the
    shards, ``adapter_model.safetensors``) reads with the ``safetensors`` library, which also checks that the file
    holds all the bytes its header promises (a truncated copy fails here). A hub id, or a folder without these files
    (transformers then says what it lacks), passes.

    Raises:
        UserError: one line naming the file: a missing shard (with the index naming it), an index that is not JSON,
            a truncated or corrupt file (the ``safetensors`` error).
    """
    from safetensors import SafetensorError, safe_open

    folder = Path(path)
    if not folder.is_dir():
        return
    files = [folder / name for name in WEIGHT_FILES if (folder / name).is_file()]
    index = folder / WEIGHT_INDEX
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            raise UserError(f"{index}: not a safetensors index (a JSON object with a 'weight_map': {err})") from None
        missing = [name for name in shards if not (folder / name).is_file()]
        if missing:
            raise UserError(f"{folder / missing[0]}: no such shard ({len(missing)} of the {len(shards)} shards "
                            f"{index.name} names are missing); copy the checkpoint again")
        files += [folder / name for name in shards]
    for file in files:
        try:
            with safe_open(str(file), framework="pt"):
                pass
        except (SafetensorError, OSError) as err:
            raise UserError(f"{file}: not a readable safetensors file ({err}); truncated or corrupt, copy the "
                            "checkpoint again") from None


@contextlib.contextmanager
def _load_report_held():
    """Hold back transformers' load report (``transformers.modeling_utils`` warnings naming a ``LOAD REPORT``) for
    the block: yields the held records, which are logged after the block unless the caller cleared them."""
    source = logging.getLogger("transformers.modeling_utils")
    held: list[logging.LogRecord] = []

    def hold(record: logging.LogRecord) -> bool:
        if "LOAD REPORT" in str(record.msg):
            held.append(record)
            return False
        return True

    source.addFilter(hold)
    try:
        yield held
    finally:
        source.removeFilter(hold)
        for record in held:
            source.handle(record)


def _broken_weights(path, message: str, held: list) -> UserError | None:
    """The one-line error for transformers' refusal of weights that do not fit the model ``config.json`` builds
    (shape mismatch, failed conversion), naming the first mismatched key of its held report; None for another
    RuntimeError."""
    if not any(text in message for text in ("ignore_mismatched_sizes", "size mismatch", "automatic conversion")):
        return None
    report = re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(str(record.msg) for record in held))
    rows = [[cell.strip() for cell in line.split("|")] for line in report.splitlines()
            if "MISMATCH" in line or "CONVERSION" in line]
    example = "" if not rows else f"{rows[0][0]}: {rows[0][-1].split(' - ')[-1]}" if len(rows[0]) >= 3 else rows[0][0]
    folder = Path(path)
    files = next((name for name in (WEIGHT_INDEX, *WEIGHT_FILES) if (folder / name).is_file()), "weights")
    return UserError(f"{folder / files}: the weights do not fit the shapes of its config.json"
                     + (f" ({example})" if example else "") + "; weights or config.json are another model's")


def load_reference(path: str, dtype: str | None = None, attn_implementation: str | None = None,
                   revision: str | None = None):
    """A frozen copy of the starting policy for the KL term: same loader, eval mode, no gradients."""
    model = load_policy(path, dtype=dtype, attn_implementation=attn_implementation, revision=revision)
    model.eval()
    model.requires_grad_(False)
    return model


def vision_tower(model):
    """The vision encoder module of a (possibly PEFT-wrapped) Qwen-VL model (with its mergers; Qwen3-VL: DeepStack too).

    Raises:
        AttributeError: the model has no ``visual`` module.
    """
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    for candidate in (getattr(base, "model", None), base):
        visual = getattr(candidate, "visual", None)
        if isinstance(visual, torch.nn.Module):
            return visual
    raise AttributeError(f"{type(base).__name__} has no vision tower ('visual')")


def freeze_vision_tower(model) -> int:
    """Stop gradients into the vision encoder (including its patch merger). Returns the number of frozen parameters."""
    visual = vision_tower(model)
    visual.requires_grad_(False)
    n = sum(p.numel() for p in visual.parameters())
    logger.info("froze the vision tower: %d parameters", n)
    return n


def default_dtype(device: torch.device) -> torch.dtype:
    """bfloat16 on a CUDA device that supports it, else float32 (CPU generation in bfloat16 is slow and lossy)."""
    if device.type == "cuda" and torch.cuda.is_bf16_supported():
        return torch.bfloat16
    return torch.float32


def load_for_inference(model_dir, device="cpu", dtype="auto", attn_implementation: str | None = None):
    """``(model, processor)`` for ``eval`` and ``infer``: :func:`load_policy` (remote code off) in eval mode on
    ``device``.

    Args:
        model_dir: folder or hub id readable by ``AutoModelForImageTextToText.from_pretrained``.
        device: where to put the model.
        dtype: ``"auto"`` (:func:`default_dtype`), a torch dtype, or its name (``"bfloat16"``, ``"float32"``).
        attn_implementation: e.g. ``"sdpa"`` or ``"flash_attention_2"``; None = the transformers default.
    """
    device = torch.device(device)
    if dtype == "auto":
        dtype = default_dtype(device)
    if isinstance(dtype, torch.dtype):
        dtype = str(dtype).removeprefix("torch.")
    model = load_policy(str(model_dir), dtype=dtype, attn_implementation=attn_implementation).to(device).eval()
    return model, load_processor(str(model_dir))


def merge_lora(adapter_dir, out_dir, base: str | None = None, dtype: str | None = None):
    """Merge a LoRA checkpoint into full weights that any engine loads as a plain model.

    Args:
        adapter_dir: a PEFT checkpoint folder (``adapter_config.json`` + adapter weights), as LoRA training saves it.
        out_dir: where the merged model is written (``save_pretrained``), with the processor of ``adapter_dir`` (or of
            the base model when the adapter folder has none).
        base: the base model (path or hub id); None = ``base_model_name_or_path`` of ``adapter_config.json``.
        dtype: dtype to load the base in (None = the checkpoint's).

    The base always loads in full precision (never k-bit): an adapter trained with ``load_in_4bit`` /
    ``load_in_8bit`` (QLoRA) is merged into the unquantized weights of the base it was trained on, as the QLoRA
    recipes merge (the adapter was fitted against their quantized copy, so the merged model differs from the trained
    one by the quantization error). A base saved quantized (``quantization_config`` in its ``config.json``) is refused.

    Returns:
        ``out_dir`` as a Path; its files get the mode ``open()`` would (:func:`grounding_rl.paths.follow_umask`).

    Raises:
        FileNotFoundError: ``adapter_dir`` has no ``adapter_config.json``.
        ValueError: no base model is named, the base is a quantized checkpoint, ``out_dir`` holds an adapter (the
            merged weights would sit beside it: :func:`check_model_folder`) or any other file (another run's or the
            base's weights and config would be overwritten, its other files left beside the merged model).
    """
    import json
    from pathlib import Path

    from peft import PeftModel

    from grounding_rl.paths import follow_umask

    adapter_dir, out_dir = Path(adapter_dir), Path(out_dir)
    config_path = adapter_dir / "adapter_config.json"
    if not config_path.is_file():
        raise FileNotFoundError(f"{adapter_dir}: no adapter_config.json (not a LoRA checkpoint)")
    if (out_dir / "adapter_config.json").is_file():
        raise ValueError(f"{out_dir} holds a LoRA adapter; write the merged model into a folder of its own")
    held = sorted(p.name + ("/" if p.is_dir() else "") for p in out_dir.iterdir()) if out_dir.is_dir() else []
    if held:  # save_pretrained would write over another model's weights and config (a run, the base itself)
        more = f" and {len(held) - 1} more" if held[1:] else ""
        raise ValueError(f"{out_dir} already holds files ({held[0]}{more}); the merged model would be written over "
                         "them: give a new or empty folder")
    base = base or json.loads(config_path.read_text()).get("base_model_name_or_path")
    if not base:
        raise ValueError(f"{config_path} names no base_model_name_or_path; pass the base model")
    base_config = Path(base) / "config.json"
    if base_config.is_file() and "quantization_config" in json.loads(base_config.read_text(encoding="utf-8")):
        raise ValueError(f"{base_config}: the base is a quantized checkpoint; merge into the full-precision base "
                         "the run loaded (--base MODEL): a LoRA run with load_in_4bit/load_in_8bit quantizes it at "
                         "load time and saves only the adapter")
    model = PeftModel.from_pretrained(load_policy(base, dtype=dtype), str(adapter_dir)).merge_and_unload()
    model.save_pretrained(out_dir)
    has_processor = (adapter_dir / "processor_config.json").is_file() or (adapter_dir / "tokenizer_config.json").is_file()
    load_processor(str(adapter_dir) if has_processor else base).save_pretrained(out_dir)
    follow_umask(out_dir)
    return out_dir


# The bound on generation lengths when a checkpoint's config names no context: 32,768 tokens, the native context of
# the Qwen2.5 language models (Qwen2.5 technical report, arXiv:2412.15115, section 2).
DEFAULT_CONTEXT_TOKENS = 32768


def context_length(path: str, revision: str | None = None) -> tuple[int, str]:
    """The most tokens (prompt plus completion) the checkpoint's language model takes, read from its ``config.json``
    before any weights load: ``max_position_embeddings`` of its text config (``PretrainedConfig.get_text_config``;
    Qwen2.5-VL: 128,000 at the top level, Qwen3-VL: 262,144 in ``text_config``). A LoRA folder without ``config.json``
    reads its base model's (``base_model_name_or_path`` of ``adapter_config.json``).

    Returns:
        ``(tokens, where the number comes from)`` for an error message; :data:`DEFAULT_CONTEXT_TOKENS` when no config
        is readable here (the model load then reports why) or it names no ``max_position_embeddings``.
    """
    from transformers import AutoConfig

    folder = Path(path)
    if folder.is_dir() and not (folder / "config.json").is_file() and (folder / "adapter_config.json").is_file():
        try:
            path = json.loads((folder / "adapter_config.json").read_text(encoding="utf-8"))["base_model_name_or_path"]
        except (OSError, ValueError, KeyError, TypeError):
            pass
    try:
        config = AutoConfig.from_pretrained(str(path), revision=revision, trust_remote_code=False)
        tokens = getattr(config.get_text_config(), "max_position_embeddings", None)
    except (OSError, ValueError):
        tokens = None
    if isinstance(tokens, int) and tokens > 0:
        return tokens, f"the context of {path}: max_position_embeddings in its config.json"
    return DEFAULT_CONTEXT_TOKENS, (f"the Qwen2.5 native context; {path} has no readable config.json naming "
                                    "max_position_embeddings")
