"""On-policy distillation from a teacher model (Agarwal et al. 2024, arXiv 2306.13649; Video-OPD, arXiv 2602.02994):
the policy samples, the teacher scores every sampled token, and the per-token divergence between the two next-token
distributions (:func:`grounding_rl.update.divergence.generalized_jsd`, TRL 1.16's conventions) joins the loss.

Two uses of one recipe: ``grounding-rl train`` with ``teacher_model_name_or_path`` adds ``distillation_weight`` × the
teacher term (β = ``distillation_beta``) to the GRPO objective (GRPO's ``beta`` keeps its meaning, the KL to the
reference model); ``grounding-rl distill`` (:class:`grounding_rl.update.distill_config.DistillationConfig`) is pure
distillation: one completion per prompt, so every advantage is 0 and the surrogate carries no gradient; the loss is the
teacher term alone, with TRL's ``beta``.

The teacher lives in the training processes: loaded frozen like the reference model (ZeRO-3-sharded under DeepSpeed,
:func:`grounding_rl.update.logprobs.frozen_copy`), held by this recipe, never by the trainer's model, so no checkpoint
holds it. It gets its own processor inputs for the same frames (resized to its family's pixel factor when that differs;
its own timestamps in the prompt), built once per clip per generation batch, then runs one forward on the student's
completion tokens per micro-batch. A vLLM-served teacher is not implemented.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from grounding_rl.paths import resolve_model_path
from grounding_rl.update import batching, divergence, grpo
from grounding_rl.update.arguments import trl_field
from grounding_rl.update.recipes.base import Recipe

TEACHER_ROW = "teacher_row"  # the loss batch's column naming each row's row in the teacher batch
TEACHER_INIT_KEYS = ("dtype", "torch_dtype", "attn_implementation", "revision")


def _distillation_field(name: str, **kwargs):
    from trl import DistillationConfig

    return trl_field(name, source=DistillationConfig, **kwargs)


@dataclass
class DistillationArguments:
    """The teacher (TRL ``DistillationConfig``'s names and help texts) and the weight of its term in GRPO."""

    teacher_model_name_or_path: str | None = _distillation_field(
        "teacher_model_name_or_path", note="Here: a Qwen-VL checkpoint (folder or hub id) of any supported family; "
        "it gets the same frames as the student through its own processor.")
    teacher_model_init_kwargs: dict | str | None = _distillation_field(
        "teacher_model_init_kwargs", note=f"Supported keys here: {', '.join(TEACHER_INIT_KEYS)} (default: the "
        "student's dtype and attention implementation).")
    distillation_beta: float = field(default=1.0, metadata={
        "help": "With GRPO (grounding-rl train): the generalized-JSD β of the teacher term, TRL DistillationConfig's "
                "beta (0 forward KL, 0.5 JSD, 1 reverse KL). GRPO's own beta stays the KL weight to the reference."})
    distillation_weight: float = field(default=0.0, metadata={
        "help": "With GRPO (grounding-rl train): the weight of the per-token teacher term added to the GRPO loss "
                "(aggregated like the GRPO loss, per loss_type). Needs teacher_model_name_or_path when > 0."})
    loss_top_k: int = field(default=0, metadata={
        "help": "0: the divergence over the whole shared vocabulary; 1: TRL's server-distillation top-1 reverse KL "
                "(the sampled token and a tail bucket; needs beta 1). TRL's default is 1, with a served teacher that "
                "returns top-k log-probs only; a teacher in the process gives the full vocabulary, so ours is 0."})

    def __post_init__(self):
        self.teacher_model_name_or_path = resolve_model_path(self.teacher_model_name_or_path)  # a hub id stays


class Distillation(Recipe):
    name = "distillation"
    arguments = DistillationArguments
    refused = {"distill": {"distillation_beta": "distill's divergence is beta (TRL's name); distillation_beta is train's",
                           "distillation_weight": "distill's loss is the teacher term alone"}}
    needs_logits = True
    switch = "teacher_model_name_or_path"

    @staticmethod
    def weight(args, config) -> float:
        """The weight of the teacher term: 1 under ``distill`` (the loss is the term alone), else ``distillation_weight``."""
        return 1.0 if config.stage == "distill" else args.distillation_weight

    @staticmethod
    def divergence_beta(args, config) -> float:
        """The generalized-JSD β of the teacher term: ``beta`` under ``distill`` (TRL's name), else ``distillation_beta``."""
        return config.beta if config.stage == "distill" else args.distillation_beta

    @staticmethod
    def teacher(args, config) -> tuple[str, str, float] | None:
        """``(teacher_model_name_or_path, its β's field name in this command, value)``, or None without a teacher."""
        if not args.teacher_model_name_or_path:
            return None
        name = "beta" if config.stage == "distill" else "distillation_beta"
        return args.teacher_model_name_or_path, name, Distillation.divergence_beta(args, config)

    @staticmethod
    def enabled(args, config) -> bool:
        return bool(args.teacher_model_name_or_path) and Distillation.weight(args, config) > 0

    @staticmethod
    def problems(args, config) -> list[str]:
        problems = []
        if config.stage == "distill" and not args.teacher_model_name_or_path:
            problems.append("teacher_model_name_or_path is required (in the YAML or as --teacher_model_name_or_path)")
        if not 0.0 <= args.distillation_beta <= 1.0:
            problems.append(f"distillation_beta must be in [0, 1] (got {args.distillation_beta})")
        if args.distillation_weight < 0:
            problems.append(f"distillation_weight must be ≥ 0 (got {args.distillation_weight})")
        if args.distillation_weight > 0 and not args.teacher_model_name_or_path:
            problems.append("distillation_weight > 0 needs teacher_model_name_or_path")
        if args.teacher_model_name_or_path and Distillation.weight(args, config) == 0:
            problems.append("teacher_model_name_or_path is set but distillation_weight is 0 (the teacher would be "
                            "loaded for nothing): set distillation_weight > 0, or use grounding-rl distill")
        if args.loss_top_k not in (0, 1):
            problems.append(f"loss_top_k must be 0 (full vocabulary) or 1 (top-1 reverse KL), got {args.loss_top_k}")
        elif args.loss_top_k == 1 and Distillation.divergence_beta(args, config) != 1.0:
            problems.append("loss_top_k 1 is TRL's top-1 reverse KL and needs beta 1 (distillation_beta with GRPO)")
        kwargs = args.teacher_model_init_kwargs
        unknown = sorted(set(kwargs) - set(TEACHER_INIT_KEYS)) if isinstance(kwargs, dict) else []
        if unknown:
            problems.append(f"teacher_model_init_kwargs: unsupported keys {unknown} (supported: "
                            f"{', '.join(TEACHER_INIT_KEYS)})")
        return problems

    # ------------------------------------------------------------------------------------------------ setup
    def setup(self, context) -> None:
        """Load the teacher and its processor, check the pair (:func:`check_pair`), prepare it like the reference.

        Raises:
            UserError: the tokenizers cannot be paired (one line, :func:`divergence.tokenizer_mismatch`).
        """
        import json

        from grounding_rl.family import family_of
        from grounding_rl.models.loading import load_processor, load_reference
        from grounding_rl.update.logprobs import frozen_copy

        args = self.args
        path = args.teacher_model_name_or_path
        self.processor = load_processor(path)
        check_pair(context.processing_class.tokenizer, self.processor.tokenizer, self.config.prompt_template, path)
        kwargs = args.teacher_model_init_kwargs or {}
        kwargs = json.loads(kwargs) if isinstance(kwargs, str) else dict(kwargs)
        student = context.accelerator.unwrap_model(context.model)
        dtype = kwargs.get("dtype", kwargs.get("torch_dtype", str(student.dtype).removeprefix("torch.")))
        teacher = load_reference(path, dtype=dtype, revision=kwargs.get("revision"),
                                 attn_implementation=kwargs.get("attn_implementation",
                                                                student.config._attn_implementation))
        self.family = family_of(teacher)
        self.student_factor = family_of(student).pixel_factor
        self.vocab = divergence.shared_vocab_size(context.processing_class.tokenizer, self.processor.tokenizer)
        self.teacher = frozen_copy(context, teacher)
        self.batch = None

    # ------------------------------------------------------------------------------------------------ inputs
    def teacher_clip(self, clip):
        """The same frames at the teacher's pixel factor (the clip itself when the families share it)."""
        factor = self.family.pixel_factor
        if factor == self.student_factor:
            return clip
        from grounding_rl.data.video import resize_frames

        height, width = clip.frames.shape[1:3]
        return replace(clip, frames=resize_frames(clip.frames, max(factor, round(height / factor) * factor),
                                                  max(factor, round(width / factor) * factor)))

    def loss_inputs(self, context, rollout, batch) -> None:
        """The teacher's prompt tensors for the rollout's rows, built once per distinct clip (its processor, its
        frame size); each loss row names its teacher row (``teacher_row``), so micro-batches select theirs."""
        clips = {}
        for item in rollout.items:
            if item["index"] not in clips:
                clips[item["index"]] = self.teacher_clip(item["clip"])
        items = [{"index": item["index"], "query": item["query"], "clip": clips[item["index"]]}
                 for item in rollout.items]
        self.batch = batching.config_prompt_batch(self.processor, items, self.config, context.accelerator.device)
        batch[TEACHER_ROW] = torch.arange(len(items), device=context.accelerator.device)

    # ------------------------------------------------------------------------------------------------ loss
    def loss_term(self, context, inputs, student_logits, num_items):
        """``weight ×`` the aggregated per-token divergence (``loss_type``'s rule) of this micro-batch; logs
        ``distillation/divergence`` (token mean, all processes) and ``distillation/weight``.

        Args:
            student_logits: (B, C, V_s) the policy's float32 completion logits, not divided by the temperature
                (:func:`grounding_rl.update.logprobs.completion_logps` with ``return_logits``).
            num_items: the ``dapo`` normaliser (:func:`grpo.dapo_normaliser`) or None.
        """
        from grounding_rl.update.logprobs import completion_logps

        args = self.config
        rows = inputs[TEACHER_ROW].tolist()
        teacher_batch = batching.select_rows(self.batch, rows)
        teacher_batch.update(completion_ids=inputs["completion_ids"], completion_mask=inputs["completion_mask"])
        with torch.no_grad():
            _, teacher_logits = completion_logps(self.teacher, teacher_batch, args.temperature, return_logits=True)
        per_token = per_token_divergence(student_logits, teacher_logits, inputs["completion_ids"], self.vocab,
                                         self.divergence_beta(self.args, args), self.args.loss_top_k,
                                         args.temperature)
        mask = inputs["completion_mask"]
        loss = grpo.aggregate_loss(per_token, mask, args.loss_type, args.max_completion_length, num_items)
        total = context.accelerator.reduce(grpo.masked_sum_count(per_token, mask), reduction="sum")
        context.log("distillation/divergence", (total[0] / total[1].clamp(min=1.0)).item())
        return self.weight(self.args, args) * loss


def per_token_divergence(student_logits: torch.Tensor, teacher_logits: torch.Tensor, completion_ids: torch.Tensor,
                         vocab: int, beta: float, loss_top_k: int, temperature: float) -> torch.Tensor:
    """The teacher term per completion token: both logits cut to the shared vocabulary, the teacher's detached, then
    :func:`divergence.top1_reverse_kl` (``loss_top_k`` 1; ids past the shared vocabulary clamped into it) or
    :func:`divergence.generalized_jsd` (``loss_top_k`` 0) at ``temperature``, in float32.

    Args:
        student_logits: (B, C, V_s) float32 logits (differentiable), not divided by the temperature.
        teacher_logits: (B, C, V_t) float32 logits, not divided by the temperature.
        completion_ids: (B, C) sampled ids.
        vocab: the shared vocabulary size (:func:`divergence.shared_vocab_size`), ≤ V_s, V_t.
        beta, loss_top_k, temperature: TRL's ``beta``, ``loss_top_k`` (0 or 1) and ``temperature``.

    Returns:
        (B, C) float32 divergence in nats (the caller masks and aggregates it). With a float32 projection of the
        same hidden states and LM heads, its masked token mean equals TRL 1.16's ``_chunked_divergence_loss``
        (``trl/trainer/distillation_trainer.py``; ``tests/test_divergence.py``).
    """
    student, teacher = student_logits[..., :vocab], teacher_logits[..., :vocab].detach()
    if loss_top_k == 1:
        return divergence.top1_reverse_kl(student, teacher, completion_ids.clamp(max=vocab - 1), temperature)
    return divergence.generalized_jsd(student, teacher, beta, temperature)


def check_pair(student_tokenizer, teacher_tokenizer, template: str, teacher_path: str) -> None:
    """Refuse a teacher whose tokens the student's cannot share (one line, ``UserError``): shared ids spelt
    differently, or chat tokens only one side defines (a Qwen3 teacher's ``<think>``) with a template that is not
    thinking-free (:func:`grounding_rl.prompts.templates.is_thinking_free`)."""
    from grounding_rl.errors import UserError
    from grounding_rl.prompts.templates import is_thinking_free

    why = divergence.tokenizer_mismatch(student_tokenizer, teacher_tokenizer, is_thinking_free(template))
    if why:
        raise UserError(f"teacher_model_name_or_path {teacher_path}: {why}")
