"""Per-token log-probs of the completion tokens under a model, given the video (policy and reference forwards).

Only completion positions reach the LM head (``logits_to_keep``) and log-probs come from TRL's
``selective_log_softmax`` (gather the chosen token's logit minus a logsumexp), never a full-vocabulary log-softmax
over the prompt (issue 7, point 3). Issue 7's shared vision encoding per clip plugs in here.
"""
from __future__ import annotations

import torch
from trl.trainer.utils import selective_log_softmax

from grounding_rl.update.batching import forward_inputs


def completion_logps(model, batch: dict, temperature: float = 1.0) -> torch.Tensor:
    """log π(o_t | prompt, video, o_<t) for each completion token.

    Args:
        model: a Qwen2.5-VL model (possibly DDP/DeepSpeed/PEFT-wrapped); called with ``logits_to_keep=C + 1``.
        batch: a row-aligned batch (:mod:`grounding_rl.update.batching`) with prompt, video and completion tensors.
        temperature: the sampling temperature; logits are divided by it as in sampling (TRL does the same), so
            π_old at generation and π_θ here describe the same distribution.

    Returns:
        (B, C) float tensor; values at masked positions are meaningless (the caller masks them).
    """
    completion_ids = batch["completion_ids"]
    length = completion_ids.size(1)
    outputs = model(**forward_inputs(batch), logits_to_keep=length + 1, use_cache=False)
    logits = outputs.logits[:, :-1, :]  # position P−1+t predicts completion token t
    if temperature != 1.0:
        logits = logits / temperature
    return selective_log_softmax(logits, completion_ids)
