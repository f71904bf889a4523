"""Per-token log-probs of the completion tokens under a model, given the video (policy and reference forwards).

Only completion positions reach the LM head (``logits_to_keep``) and log-probs come from TRL's
``selective_log_softmax`` (gather the chosen token's logit minus a logsumexp), never a full-vocabulary log-softmax
over the prompt. For a shared-video batch (``video_index``) the vision tower runs once per
distinct clip and every row gets its clip's features through ``mm_encoder_outputs``.
"""
from __future__ import annotations

from trl.trainer.utils import selective_log_softmax

from grounding_rl.models.vision import encode_videos
from grounding_rl.prompts.preprocessing import PIXELS, VIDEO_INDEX
from grounding_rl.update.batching import clip_grid, forward_inputs
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

        return_logits: also return the (B, C, V) completion logits (divided by ``temperature``; a distillation
            teacher term needs the whole distribution).

    Returns:
        (B, C) float tensor; values at masked positions are meaningless (the caller masks them). With
        ``return_logits``: ``(logps, logits)``.
    """
    from grounding_rl.update.conversation import CONVERSATION, conversation_logps

    if CONVERSATION in batch:  # multi-turn: every video of a row, one forward (grounding_rl.update.conversation)
        return conversation_logps(model, batch, temperature, return_logits)
    if share_prompt and VIDEO_INDEX in batch:
        return packed_completion_logps(model, batch, temperature, return_logits)
    completion_ids = batch["completion_ids"]
    length = completion_ids.size(1)
    inputs = forward_inputs(batch)
    if VIDEO_INDEX in inputs:
        video_index = inputs.pop(VIDEO_INDEX)
        inputs["mm_encoder_outputs"] = encode_videos(model, inputs.pop(PIXELS), clip_grid(batch), video_index)
    outputs = model(**inputs, logits_to_keep=length + 1, use_cache=False)
    logits = outputs.logits[:, :-1, :]  # position P−1+t predicts completion token t
    if temperature != 1.0:
        logits = logits / temperature
    logps = selective_log_softmax(logits, completion_ids)
    return (logps, logits) if return_logits else logps


def reference_model(trainer, ref_model=None):
    """The trainer's π_ref: None when β = 0 or with PEFT (the adapter is disabled instead); else ``ref_model`` (None =
    loaded from the policy's path) frozen, DeepSpeed-initialised (``trl.models.prepare_deepspeed``: ZeRO-3 sharded like
    the policy, no optimizer) or accelerate-prepared."""
    from accelerate.utils import is_peft_model

    if trainer.args.kl_beta == 0.0 or is_peft_model(trainer.model):
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
