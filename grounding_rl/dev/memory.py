"""How much GPU memory a GRPO recipe needs per GPU, from the model's real shape built on the ``meta`` device.

Model states follow DeepSpeed's own estimators (``deepspeed.runtime.zero.stage_1_and_2.
estimate_zero2_model_states_mem_needs`` and ``deepspeed.runtime.zero.stage3.estimate_zero3_model_states_mem_needs``,
DeepSpeed 0.19): bf16 mixed precision with Adam keeps 18 bytes per trainable parameter partitioned over the N GPUs
(16-bit gradients 2, fp32 gradients 4, fp32 master weights 4, Adam moments 8) besides the 16-bit weights; ZeRO-2
replicates the 16-bit weights, ZeRO-3 partitions them and gathers one layer at a time (4 bytes × the largest layer's
parameters). ZeRO-1 partitions the optimizer states only: the 16-bit weights and 16-bit gradients stay whole on
every GPU (2 + 2 bytes per parameter), the fp32 gradients, master weights and moments (16 bytes) are partitioned
(DeepSpeed's stage_1_and_2 module serves stages 1 and 2; its estimator, which does not tell them apart, is
reported beside it). Without DeepSpeed (plain DDP or one process) the weights, gradients and both AdamW moments are in
the parameters' own dtype (``torch.optim.AdamW`` keeps its state like the parameter). LoRA adapters are fp32 (PEFT's
``autocast_adapter_dtype``). A reference model (β > 0, no LoRA) is a second copy of the 16-bit weights, partitioned
under ZeRO-3 (``trl.models.prepare_deepspeed``), replicated otherwise.

Activations are an estimate, stated so it can be checked (bytes per token per layer, b = bytes of the dtype):
``b · (5·h + 4·i + 2·kv)`` for a decoder layer of width h, MLP width i and key/value width kv (layer-norm and
attention inputs, q/k/v, attention output, SwiGLU gate/up/activation/product; no s² term: SDPA/flash attention keeps
no attention matrix), after Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models"
(§4, 34·s·b·h bytes per GPT layer without the attention-score terms). With activation checkpointing each layer keeps
only its input (b·h per token) and one layer at a time is recomputed, twice its activations counting their
gradients. The completion-only logits (``logits_to_keep``) of the micro-batch and their gradient are ``rows · C · V``
values each in the dtype, plus one row's fp32 log-softmax and its gradient (TRL's ``selective_log_softmax`` works
row by row); with a distillation teacher, both heads' float32 logits (the student's with its gradient) come on top.
Generation holds the KV cache ``2 · layers · kv · b`` bytes per token of every row it samples at once.
The peak is the model states plus the larger of training and generation, plus a fixed :data:`CUDA_OVERHEAD` for the
CUDA context and allocator fragmentation (an assumption, typically 1-3 GiB).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

CUDA_OVERHEAD = 2 * 2**30  # bytes: CUDA context + allocator fragmentation (assumed)
TEXT_TOKENS = 300  # prompt text besides the video: template, query, chat markup (generous; tests/test_recipes.py)


@dataclass(frozen=True)
class ModelShape:
    """Sizes of a Qwen-VL model read off its ``meta``-device instance.

    Attributes:
        total_params: all parameters, tied ones counted once.
        vision_params: parameters of the vision tower (``model.visual``), merger included.
        largest_layer_params: parameters owned directly by one module (DeepSpeed's ``model_to_params`` rule; the
            embedding for these models).
        trainable_params: parameters that get gradients (all, or all but the vision tower, or the LoRA adapter).
        lora_params: the LoRA adapter's parameters (0 without LoRA); counted in ``trainable_params`` too.
        layers, hidden, intermediate, kv_width, vocab: the language model's depth, width, MLP width,
            key/value width (``num_key_value_heads × head_dim``) and vocabulary rows.
        vision_depth, vision_hidden, vision_intermediate, merge: the vision tower's depth, widths and spatial merge
            size (patches per video token = merge²).
    """

    total_params: int
    vision_params: int
    largest_layer_params: int
    trainable_params: int
    lora_params: int
    layers: int
    hidden: int
    intermediate: int
    kv_width: int
    vocab: int
    vision_depth: int
    vision_hidden: int
    vision_intermediate: int
    merge: int


@dataclass(frozen=True)
class Strategy:
    """How the model states are spread over the GPUs.

    Attributes:
        name: a label (the accelerate config's file stem, e.g. ``zero3``).
        zero_stage: 0 = no DeepSpeed (DDP or one process), 1, 2 or 3 = DeepSpeed ZeRO stage.
        offload_optimizer: optimizer states (and ZeRO's fp32 gradients) in CPU RAM.
        offload_param: ZeRO-3 weights in CPU RAM.
    """

    name: str
    zero_stage: int
    offload_optimizer: bool = False
    offload_param: bool = False


@dataclass(frozen=True)
class Workload:
    """What one GPU processes, from a recipe.

    Attributes:
        rows: completions per micro-batch (``per_device_train_batch_size``).
        generation_rows: completions sampled at once (``rows × steps_per_generation``).
        num_generations: G; with ``share_video_encoding`` the vision tower runs once per clip (rows / G clips).
        video_tokens: merged video tokens of one clip's prompt.
        completion_tokens: ``max_completion_length``.
        time_tokens: text tokens the family writes to time the frames (Qwen3-VL's ``<t seconds>``; 0 for
            Qwen2.5-VL): in the sequence, not in the vision tower.
        dtype_bytes: bytes per weight and activation (2 for bf16, 4 for fp32).
        checkpointing: activation (gradient) checkpointing on.
        beta: KL weight; > 0 without LoRA adds a reference model.
        use_peft: LoRA (the reference is the adapter-free base; no copy).
        freeze_vision: the vision tower has no gradients (no saved vision activations).
        share_video_encoding: encode each clip once per micro-batch.
        teacher_params: parameters of a distillation teacher held frozen in the process (0: none).
        teacher_vocab: its LM head's rows (its completion logits per row are kept for the divergence).
    """

    rows: int
    generation_rows: int
    num_generations: int
    video_tokens: int
    completion_tokens: int
    dtype_bytes: int = 2
    checkpointing: bool = True
    beta: float = 0.0
    use_peft: bool = False
    freeze_vision: bool = False
    share_video_encoding: bool = True
    time_tokens: int = 0
    teacher_params: int = 0
    teacher_vocab: int = 0

    @property
    def prompt_tokens(self) -> int:
        """Video, its timestamps and :data:`TEXT_TOKENS`."""
        return self.video_tokens + self.time_tokens + TEXT_TOKENS

    @property
    def sequence_tokens(self) -> int:
        """Prompt (:attr:`prompt_tokens`) plus completion."""
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes per GPU (see the module docstring for each rule); ``total`` adds :data:`CUDA_OVERHEAD`."""

    weights: int
    gradients: int
    optimizer: int
    reference: int
    activations: int
    training_activations: int
    generation_activations: int
    overhead: int
    total: int
    teacher: int = 0

    @property
    def model_states(self) -> int:
        """Weights + gradients + optimizer states (what DeepSpeed's estimators count)."""
        return self.weights + self.gradients + self.optimizer


# ----------------------------------------------------------------------------------------------- model shapes
def model_config(name_or_path: str, shared: Path | None = None):
    """The ``transformers`` config of a recipe's model: a local folder, else ``shared/models/<name>`` for a hub id
    ``Qwen/<name>`` (../shared holds the configs, no weights), else the hub (its config.json only).

    Raises:
        OSError: no config can be found (offline and not in ``shared``).
    """
    from transformers import AutoConfig

    local = Path(name_or_path)
    if not (local / "config.json").is_file() and shared is not None and "/" in name_or_path:
        candidate = shared / "models" / name_or_path.split("/", 1)[1]
        if (candidate / "config.json").is_file():
            local = candidate
    source = str(local) if (local / "config.json").is_file() else name_or_path
    return AutoConfig.from_pretrained(source, trust_remote_code=False)


def meta_model(config):
    """``AutoModelForImageTextToText.from_config(config)`` on the ``meta`` device (no memory, no weights)."""
    import torch
    from transformers import AutoModelForImageTextToText

    with torch.device("meta"):
        return AutoModelForImageTextToText.from_config(config, trust_remote_code=False)


def lora_adapter_params(model, peft_config) -> int:
    """Parameters of a LoRA adapter on ``model``: r · (in + out) for every ``nn.Linear`` PEFT would wrap
    (``peft.tuners.tuners_utils.check_target_module_exists``), as PEFT's ``LoraLayer.update_layer`` creates
    ``lora_A`` (r × in) and ``lora_B`` (out × r)."""
    import torch
    from peft.tuners.tuners_utils import check_target_module_exists

    return sum(peft_config.r * (module.in_features + module.out_features)
               for name, module in model.named_modules()
               if isinstance(module, torch.nn.Linear) and check_target_module_exists(peft_config, name))


def model_shape(model, freeze_vision: bool = False, peft_config=None) -> ModelShape:
    """:class:`ModelShape` of a (meta-device) Qwen2.5-VL or Qwen3-VL model.

    Args:
        model: ``...ForConditionalGeneration`` instance (``model.model.visual`` is the vision tower).
        freeze_vision: the vision tower gets no gradients.
        peft_config: a ``peft.LoraConfig``; then only the adapter is trainable.
    """
    total = sum(p.numel() for p in model.parameters())  # parameters() yields a tied parameter once
    vision = sum(p.numel() for p in model.model.visual.parameters())
    largest = max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules())
    lora = lora_adapter_params(model, peft_config) if peft_config is not None else 0
    trainable = lora if peft_config is not None else total - (vision if freeze_vision else 0)
    text, vis = model.config.text_config, model.config.vision_config
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    return ModelShape(
        total_params=total + lora, vision_params=vision, largest_layer_params=largest, trainable_params=trainable,
        lora_params=lora, layers=text.num_hidden_layers, hidden=text.hidden_size,
        intermediate=text.intermediate_size, kv_width=text.num_key_value_heads * head_dim, vocab=text.vocab_size,
        vision_depth=vis.depth, vision_hidden=vis.hidden_size, vision_intermediate=vis.intermediate_size,
        merge=vis.spatial_merge_size)


# ----------------------------------------------------------------------------------------------- strategies
def strategy_from_accelerate_config(path: Path) -> Strategy:
    """:class:`Strategy` of an accelerate YAML (``distributed_type`` DEEPSPEED reads its ``deepspeed_config_file``,
    relative to the repository root as the launch is; anything else is plain data parallel).

    Raises:
        ValueError: a DeepSpeed config whose ZeRO stage is not 1, 2 or 3.
    """
    from grounding_rl.paths import REPO_ROOT
    from grounding_rl.yaml_files import load_yaml

    data = load_yaml(path) or {}
    if data.get("distributed_type") != "DEEPSPEED":
        return Strategy(Path(path).stem, 0)
    ds = data.get("deepspeed_config") or {}
    json_path = Path(ds.get("deepspeed_config_file", ""))
    if not json_path.is_absolute():
        json_path = REPO_ROOT / json_path  # accelerate resolves it against the launch folder, the repository root
    if json_path.is_file():
        zero = json.loads(json_path.read_text()).get("zero_optimization") or {}
    else:  # accelerate's inline keys
        zero = {"stage": ds.get("zero_stage"), "offload_optimizer": {"device": ds.get("offload_optimizer_device")},
                "offload_param": {"device": ds.get("offload_param_device")}}
    stage = zero.get("stage")
    if stage not in (1, 2, 3):
        raise ValueError(f"{path}: ZeRO stage {stage!r} in {json_path}; the estimate covers stages 1, 2 and 3")

    def offloaded(key):
        return (zero.get(key) or {}).get("device", "none") not in ("none", None)

    return Strategy(Path(path).stem, int(stage), offloaded("offload_optimizer"), offloaded("offload_param"))


# ----------------------------------------------------------------------------------------------- the estimate
def layer_token_bytes(hidden: int, intermediate: int, kv_width: int, dtype_bytes: int) -> int:
    """Activation bytes one decoder layer keeps per token: ``b · (5h + 4i + 2kv)`` (module docstring)."""
    return dtype_bytes * (5 * hidden + 4 * intermediate + 2 * kv_width)


def activation_bytes(shape: ModelShape, work: Workload) -> tuple[int, int]:
    """(training, generation) activation bytes of one GPU's micro-batch and generation batch (module docstring).

    Training: the language model over ``rows × sequence_tokens`` tokens (the per-row forward; running a group's
    shared prompt once needs fewer, so this is an upper bound there), the completion-only logits, and the vision
    tower over ``merge² × video_tokens`` patches per clip (once per clip with sharing, per row without; nothing saved
    when frozen). Generation: the KV cache of ``generation_rows`` rows of ``sequence_tokens``, plus one decoder
    layer of the prefill (once per clip with sharing).
    """
    b = work.dtype_bytes
    tokens = work.rows * work.sequence_tokens
    per_layer = layer_token_bytes(shape.hidden, shape.intermediate, shape.kv_width, b)
    if work.checkpointing:  # saved layer inputs + one layer recomputed, with its gradients
        text = shape.layers * tokens * shape.hidden * b + 2 * tokens * per_layer
    else:
        text = shape.layers * tokens * per_layer
    logits = 2 * work.rows * work.completion_tokens * shape.vocab * b + 2 * work.completion_tokens * shape.vocab * 4
    clips = math.ceil(work.rows / work.num_generations) if work.share_video_encoding else work.rows
    patches = clips * work.video_tokens * shape.merge ** 2
    vision_layer = layer_token_bytes(shape.vision_hidden, shape.vision_intermediate, shape.vision_hidden, b)
    if work.freeze_vision:
        vision = patches * vision_layer  # no graph: one block at a time
    elif work.checkpointing:
        vision = shape.vision_depth * patches * shape.vision_hidden * b + 2 * patches * vision_layer
    else:
        vision = shape.vision_depth * patches * vision_layer
    if work.teacher_params:  # float32 logits of both heads (the student's with its gradient; the teacher's without
        # a graph) beside the student's rounded copy counted above, and the divergence's fp32 terms (saved)
        logits += work.rows * work.completion_tokens * (work.teacher_vocab * 4 + 2 * shape.vocab * 4
                                                        + 3 * shape.vocab * 4)
    training = text + logits + vision
    kv_cache = work.generation_rows * work.sequence_tokens * 2 * shape.layers * shape.kv_width * b
    prefill_rows = math.ceil(work.generation_rows / work.num_generations) if work.share_video_encoding else \
        work.generation_rows
    prefill = prefill_rows * work.prompt_tokens * per_layer  # one layer of the prefill
    encode = prefill_rows * work.video_tokens * shape.merge ** 2 * vision_layer  # one vision block, no graph
    generation = kv_cache + max(prefill, encode)
    return int(training), int(generation)


def estimate(shape: ModelShape, work: Workload, strategy: Strategy, gpus: int) -> MemoryEstimate:
    """Per-GPU bytes of a recipe's workload under ``strategy`` on ``gpus`` GPUs (rules: module docstring).

    Raises:
        ValueError: ``gpus`` < 1.
    """
    if gpus < 1:
        raise ValueError(f"gpus must be ≥ 1, got {gpus}")
    total, trainable, largest = shape.total_params, shape.trainable_params, shape.largest_layer_params
    base = total - shape.lora_params
    reference_copy = work.beta > 0 and not work.use_peft
    if strategy.zero_stage == 0:
        b = work.dtype_bytes
        tb = 4 if work.use_peft else b  # LoRA adapters in fp32
        weights = base * b + shape.lora_params * 4
        gradients, optimizer = trainable * tb, 2 * trainable * tb
        reference = base * b if reference_copy else 0
    elif strategy.zero_stage in (1, 2):
        weights = 2 * total
        whole = 2 * trainable if strategy.zero_stage == 1 else 0  # ZeRO-1: the 16-bit gradients unpartitioned
        gradients = whole + (0 if strategy.offload_optimizer else (4 if whole else 2 + 4) * trainable // gpus)
        optimizer = 0 if strategy.offload_optimizer else 12 * trainable // gpus
        reference = 2 * base if reference_copy else 0  # stage 0 copy (trl.models.prepare_deepspeed)
    else:
        gather = 4 * largest
        weights = gather if strategy.offload_param else gather + 2 * total // gpus
        # DeepSpeed's 18 bytes per parameter under ZeRO-3 less the 16-bit weights' 2
        gradients = 0 if strategy.offload_optimizer else 4 * trainable // gpus
        optimizer = 0 if strategy.offload_optimizer else 12 * trainable // gpus
        reference = (0 if strategy.offload_param else 2 * base // gpus) if reference_copy else 0
    # a distillation teacher: frozen like the reference model (trl.models.prepare_deepspeed), in the weights' dtype
    teacher_bytes = work.teacher_params * (work.dtype_bytes if strategy.zero_stage == 0 else 2)
    if strategy.zero_stage == 3:
        teacher_bytes = 0 if strategy.offload_param else teacher_bytes // gpus
    training, generation = activation_bytes(shape, work)
    activations = max(training, generation)
    peak = weights + gradients + optimizer + reference + teacher_bytes + activations + CUDA_OVERHEAD
    return MemoryEstimate(int(weights), int(gradients), int(optimizer), int(reference), activations, training,
                          generation, CUDA_OVERHEAD, int(peak), int(teacher_bytes))


def deepspeed_model_states(shape: ModelShape, strategy: Strategy, gpus: int, nodes: int = 1) -> int | None:
    """DeepSpeed's own per-GPU model-state estimate (every parameter trainable), or None without ZeRO.

    ``estimate_zero2_model_states_mem_needs`` / ``estimate_zero3_model_states_mem_needs`` (``zero_init`` on, as
    accelerate's ``zero3_init_flag``) — the numbers behind the tables ``..._all_cold`` prints.
    """
    if strategy.zero_stage == 0:
        return None
    per_node = max(gpus // nodes, 1)
    if strategy.zero_stage in (1, 2):
        from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

        return estimate_zero2_model_states_mem_needs(shape.total_params, per_node, nodes,
                                                     cpu_offload=strategy.offload_optimizer)[1]
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs

    return estimate_zero3_model_states_mem_needs(
        shape.total_params, shape.largest_layer_params, per_node, nodes, cpu_offload=strategy.offload_optimizer,
        cpu_offload_params=strategy.offload_param, zero_init=True)[1]
