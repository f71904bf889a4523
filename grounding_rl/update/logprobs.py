"""Per-token log-probs of the completion tokens under a model, given the video (policy and reference forwards).

Only completion positions reach the LM head (``logits_to_keep``) and log-probs come from TRL's
``selective_log_softmax`` (gather the chosen token's logit minus a logsumexp), never a full-vocabulary log-softmax
over the prompt. For a shared-video batch (``video_index``) the vision tower runs once per
distinct clip and every row gets its clip's features through ``mm_encoder_outputs``.
"""
from __future__ import annotations

from contextlib import contextmanager, nullcontext

import torch

from grounding_rl.models.vision import encode_videos, unwrap
from grounding_rl.prompts.preprocessing import PIXELS, VIDEO_INDEX
from grounding_rl.update.batching import OWN_LOGITS_DTYPE, clip_grid, completion_outputs, forward_inputs
from grounding_rl.update.divergence import float32_logits
from grounding_rl.update.prefix import packed_completion_logps


def completion_logps(model, batch: dict, temperature: float = 1.0, share_prompt: bool = False,
                     return_logits: bool = False):
    """log π(o_t | prompt, video, o_<t) for each completion token.

    Args:
        model: a Qwen-VL model (possibly DDP/DeepSpeed/PEFT-wrapped); called with ``logits_to_keep=C + 1``.
        batch: a row-aligned batch (:mod:`grounding_rl.update.batching`) with prompt, video and completion tensors;
            with ``video_index`` the distinct clips are encoded once (gradients of all their rows flow into it).
        temperature: the sampling temperature; logits are divided by it as in sampling (TRL does the same), so
            π_old at generation and π_θ here describe the same distribution.
        share_prompt: with a shared-video batch, run each group's prompt once
            (:func:`grounding_rl.update.prefix.packed_completion_logps`; the caller checks the model supports it).

        return_logits: also return the (B, C, V) completion logits, float32 (the LM head runs under
            :func:`float32_head`) and *not* divided by ``temperature`` (a distillation term needs the whole
            distribution; :mod:`grounding_rl.update.divergence` applies the temperature in float32). The log-probs
            are unchanged: they come from the logits rounded to the model's own logits dtype.

    Returns:
        (B, C) float tensor; values at masked positions are meaningless (the caller masks them). With
        ``return_logits``: ``(logps, logits)``.
    """
    from grounding_rl.update.conversation import CONVERSATION, conversation_logps

    with float32_head(model) if return_logits else nullcontext():
        if CONVERSATION in batch:  # multi-turn: every video of a row, one forward (grounding_rl.update.conversation)
            return conversation_logps(model, batch, temperature, return_logits)
        if share_prompt and VIDEO_INDEX in batch:
            return packed_completion_logps(model, batch, temperature, return_logits)
        completion_ids = batch["completion_ids"]
        inputs = forward_inputs(batch)
        if VIDEO_INDEX in inputs:
            video_index = inputs.pop(VIDEO_INDEX)
            inputs["mm_encoder_outputs"] = encode_videos(model, inputs.pop(PIXELS), clip_grid(batch), video_index)
        outputs = model(**inputs, logits_to_keep=completion_ids.size(1) + 1, use_cache=False)
        # position P−1+t predicts completion token t
        return completion_outputs(model, outputs.logits[:, :-1, :], completion_ids, temperature, return_logits)


@contextmanager
def float32_head(model):
    """Within the block, ``model``'s LM head returns float32 logits: :func:`grounding_rl.update.divergence.
    float32_logits` of its input and weight, TRL 1.16's ``trl/kernels/chunked_divergence.py`` ``_project`` (a float32
    projection result "avoids rounding logits before computing the divergence"). The head module itself is called as
    before (its hooks run: a ZeRO-3 head is gathered as usual), only its ``forward`` is replaced, and restored on exit;
    each call records on the head (``OWN_LOGITS_DTYPE``) the dtype its own forward would have returned there
    (autocast's dtype while autocast is on, else the promotion of the input's and the weight's), which
    :func:`grounding_rl.update.batching.completion_outputs` rounds the log-probs' logits to.

    Raises:
        ValueError: the head is not a plain ``torch.nn.Linear`` (e.g. a LoRA-wrapped head).
    """
    head = unwrap(model).get_output_embeddings()
    if type(head) is not torch.nn.Linear:
        raise ValueError(f"the LM head is a {type(head).__name__}, not a plain Linear: float32 distillation logits "
                         "need the head's weight (leave lm_head out of the adapter's target modules)")

    def forward(hidden):
        device = hidden.device.type
        own = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else \
            torch.promote_types(hidden.dtype, head.weight.dtype)
        setattr(head, OWN_LOGITS_DTYPE, own)
        return float32_logits(hidden, head.weight, head.bias)

    head.forward = forward
    try:
        yield head
    finally:
        del head.forward
        if hasattr(head, OWN_LOGITS_DTYPE):
            delattr(head, OWN_LOGITS_DTYPE)


def reference_model(trainer, ref_model=None):
    """The trainer's π_ref: None when β = 0 or with PEFT (the adapter is disabled instead); else ``ref_model`` (None =
    loaded from the policy's path) frozen and placed like the policy (:func:`frozen_copy`)."""
    from accelerate.utils import is_peft_model

    if trainer.beta == 0.0 or is_peft_model(trainer.model):
        return None
    if ref_model is None:
        from grounding_rl.models.loading import load_reference

        unwrapped = trainer.accelerator.unwrap_model(trainer.model)
        ref_model = load_reference(unwrapped.config._name_or_path, dtype=str(unwrapped.dtype).removeprefix("torch."),
                                   attn_implementation=unwrapped.config._attn_implementation)
    return frozen_copy(trainer, ref_model)


def frozen_copy(trainer, model):
    """``model`` frozen (eval mode, no gradients) and placed like the trainer's policy: DeepSpeed-initialised
    (``trl.models.prepare_deepspeed``: ZeRO-3 sharded like the policy, no optimizer) or accelerate-prepared for
    evaluation. The reference model and a distillation teacher; neither is part of the policy's checkpoints."""
    model.eval().requires_grad_(False)
    if trainer.is_deepspeed_enabled:
        from trl.models import prepare_deepspeed

        return prepare_deepspeed(model, trainer.accelerator)
    return trainer.accelerator.prepare_model(model, evaluation_mode=True)


def prefix_sharing(model, args) -> bool:
    """``share_prompt_prefix`` where it applies (:func:`grounding_rl.update.prefix.supports_prefix_sharing` and
    ``share_video_encoding``); otherwise one warning, and False: the per-row forward."""
    import logging

    if not args.share_prompt_prefix:
        return False
    from grounding_rl.update.prefix import supports_prefix_sharing

    ok, why = supports_prefix_sharing(model)
    if ok and not args.share_video_encoding:
        ok, why = False, "share_video_encoding is off"
    if not ok:
        logging.getLogger("grounding_rl.update.trainer").warning(
            "share_prompt_prefix: %s; the policy and reference forwards run per row", why)
    return ok
