"""Per-token divergences between a student's and a teacher's next-token distributions (on-policy distillation).

Conventions are TRL 1.16's stable distillation (``trl/trainer/distillation_trainer.py`` ``_chunked_divergence_loss``,
``trl/kernels/chunked_divergence.py`` ``ChunkedDivergenceFunction``; Agarwal et al. 2024, "On-Policy Distillation of
Language Models", arXiv 2306.13649): with p_s the student's and p_t the teacher's softmax at ``temperature``,

- β = 0: forward KL(p_t ‖ p_s) = Σ_v p_t (log p_t − log p_s);
- β = 1: reverse KL(p_s ‖ p_t) = Σ_v p_s (log p_s − log p_t);
- 0 < β < 1: generalized JSD, with the mixture m = (1 − β)·p_s + β·p_t:
  β·KL(p_t ‖ m) + (1 − β)·KL(p_s ‖ m) (β = 0.5 is the JSD).

As in TRL the vocabulary is folded in chunks of :data:`VOCAB_CHUNK_SIZE` rows: a first pass accumulates both
log-normalisers chunk by chunk (logsumexp of logsumexps), a second pass sums each chunk's terms. The logits are cast to
float32 *before* the temperature divides them, and the trainer's distillation forwards hand them float32 from the
start: :func:`float32_logits` projects the last hidden states through the LM head with a float32 result, as TRL's
``kernels/chunked_divergence.py`` ``_project`` does ("FP32 projection output avoids rounding logits before computing
the divergence"). Unlike TRL's kernel, which projects tile by tile inside its divergence, these functions take the
(B, C, V) logits (the forward keeps only the completion positions, ``logits_to_keep``) and let autograd differentiate;
the gradient reaches the student logits only when the caller detaches the teacher's.

:func:`top1_reverse_kl` is TRL's ``loss_top_k: 1`` reverse KL (``trl/experimental/server_distillation``,
``_compute_sparse_top_1_divergence_loss`` with ``reverse_kl_top_1_mode: sampled`` and ``loss_add_tail: true``): the
reverse KL between the two-bucket distributions {sampled token, the rest}.
"""
from __future__ import annotations

import math

import torch

VOCAB_CHUNK_SIZE = 32768  # TRL's kernels/chunked_divergence.py


class _Float32Projection(torch.autograd.Function):
    """hidden @ weightᵀ (+ bias) with a float32 result, folded over the vocabulary; saves the inputs as they are (no
    float32 copy of the weight is kept for the backward)."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, chunk):
        ctx.save_for_backward(hidden, weight)
        ctx.chunk, ctx.bias_dtype = chunk, None if bias is None else bias.dtype
        flat = hidden.reshape(-1, hidden.size(-1)).float()
        out = torch.empty(flat.size(0), weight.size(0), dtype=torch.float32, device=hidden.device)
        with torch.autocast(hidden.device.type, enabled=False):
            for start in range(0, weight.size(0), chunk):
                out[:, start:start + chunk] = flat @ weight[start:start + chunk].float().t()
            if bias is not None:
                out += bias.float()
        return out.view(*hidden.shape[:-1], weight.size(0))

    @staticmethod
    def backward(ctx, grad):
        hidden, weight = ctx.saved_tensors
        grad = grad.reshape(-1, weight.size(0)).float()
        flat = hidden.reshape(-1, hidden.size(-1))
        grad_hidden = grad_weight = grad_bias = None
        with torch.autocast(hidden.device.type, enabled=False):
            if ctx.needs_input_grad[0]:
                total = torch.zeros(flat.shape, dtype=torch.float32, device=hidden.device)
                for start in range(0, weight.size(0), ctx.chunk):
                    total += grad[:, start:start + ctx.chunk] @ weight[start:start + ctx.chunk].float()
                grad_hidden = total.to(hidden.dtype).view(hidden.shape)
            if ctx.needs_input_grad[1]:
                grad_weight = (grad.t() @ flat.float()).to(weight.dtype)
            if ctx.needs_input_grad[2]:
                grad_bias = grad.sum(0).to(ctx.bias_dtype)
        return grad_hidden, grad_weight, grad_bias, None


def float32_logits(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                   vocab_chunk_size: int = VOCAB_CHUNK_SIZE) -> torch.Tensor:
    """An LM head's logits with a float32 result: ``hidden.float() @ weight.float()ᵀ (+ bias)``, as TRL 1.16's
    ``trl/kernels/chunked_divergence.py`` ``_project`` computes them (off CUDA, and on CUDA up to the order of the
    float32 sums), so that a bf16 model's logits are not rounded to bf16 before a divergence.

    Args:
        hidden: (..., H) last hidden states (any float dtype; differentiable).
        weight: (V, H) the head's weight (any float dtype; differentiable: its gradient comes back in its dtype).
        bias: (V,) or None.
        vocab_chunk_size: rows of the weight cast to float32 at once (TRL's 32768): the float32 copy of a chunk is
            temporary, the backward recasts it.

    Returns:
        (..., V) float32 logits. Their gradient reaches ``hidden`` cast back to its dtype (as TRL's kernel does).
    """
    return _Float32Projection.apply(hidden, weight, bias, vocab_chunk_size)


def _log_normaliser(logits: torch.Tensor, chunk: int) -> torch.Tensor:
    parts = [torch.logsumexp(logits[..., start:start + chunk], dim=-1)
             for start in range(0, logits.size(-1), chunk)]
    return torch.logsumexp(torch.stack(parts, dim=-1), dim=-1)


def generalized_jsd(student_logits: torch.Tensor, teacher_logits: torch.Tensor, beta: float,
                    temperature: float = 1.0, vocab_chunk_size: int = VOCAB_CHUNK_SIZE) -> torch.Tensor:
    """Per-token generalized JSD between the student's and the teacher's distributions (TRL 1.16's conventions).

    Args:
        student_logits: (..., V) student logits (any float dtype; differentiable). Cast to float32 first, then divided
            by the temperature: bf16 logits give the float32 computation on the same values (the distillation forwards
            pass float32 logits, :func:`float32_logits`).
        teacher_logits: (..., V') teacher logits with V' = V: the caller keeps the ids both tokenizers define
            (:func:`shared_vocab_size`), which also drops an LM head's padding rows.
        beta: in [0, 1]: 0 forward KL(p_t ‖ p_s), 1 reverse KL(p_s ‖ p_t), else β·KL(p_t ‖ m) + (1 − β)·KL(p_s ‖ m)
            with m = (1 − β)·p_s + β·p_t.
        temperature: both logits are divided by it before the softmax (TRL's ``temperature``).
        vocab_chunk_size: rows of the vocabulary folded at once (TRL's 32768).

    Returns:
        (...) float32 divergence per position, in nats (≥ 0 up to rounding). Example: p_s = (0.5, 0.5),
        p_t = (0.9, 0.1): β = 1 → 0.5108; β = 0 → 0.3681; β = 0.5 → 0.1017 (test_divergence.py holds these).

    Raises:
        ValueError: β outside [0, 1], temperature ≤ 0, or shapes that differ.
    """
    if not 0.0 <= beta <= 1.0:
        raise ValueError(f"beta must be in [0, 1] (got {beta})")
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0 (got {temperature})")
    if student_logits.shape != teacher_logits.shape:
        raise ValueError(f"student logits {tuple(student_logits.shape)} and teacher logits "
                         f"{tuple(teacher_logits.shape)} differ: slice both to the shared vocabulary first")
    s, t = student_logits.float() / temperature, teacher_logits.float() / temperature
    s_log_z, t_log_z = _log_normaliser(s, vocab_chunk_size), _log_normaliser(t, vocab_chunk_size)
    total = torch.zeros(s.shape[:-1], dtype=torch.float32, device=s.device)
    for start in range(0, s.size(-1), vocab_chunk_size):
        log_ps = s[..., start:start + vocab_chunk_size] - s_log_z.unsqueeze(-1)
        log_pt = t[..., start:start + vocab_chunk_size] - t_log_z.unsqueeze(-1)
        if beta == 0.0:
            terms = log_pt.exp() * (log_pt - log_ps)
        elif beta == 1.0:
            terms = log_ps.exp() * (log_ps - log_pt)
        else:
            log_m = torch.logaddexp(log_ps + math.log(1 - beta), log_pt + math.log(beta))
            terms = beta * log_pt.exp() * (log_pt - log_m) + (1 - beta) * log_ps.exp() * (log_ps - log_m)
        total = total + terms.sum(-1)
    return total


def top1_reverse_kl(student_logits: torch.Tensor, teacher_logits: torch.Tensor, token_ids: torch.Tensor,
                    temperature: float = 1.0, vocab_chunk_size: int = VOCAB_CHUNK_SIZE) -> torch.Tensor:
    """Per-token reverse KL on the top-1 support of the sampled token with a tail bucket (TRL 1.16's ``loss_top_k: 1``,
    β = 1, ``reverse_kl_top_1_mode: sampled``, ``loss_add_tail: true``: ``trl/experimental/server_distillation/
    server_distillation_trainer.py`` ``_compute_sparse_top_1_divergence_loss``, ``_add_tail_bucket``,
    ``_jsd_divergence``): with a = p_s(y), b = p_t(y) for the sampled token y,
    ``a·log(a/b) + (1 − a')·log((1 − a')/(1 − b'))``, where a' and b' are a and b with their log clamped to ≤ −1e-7
    (TRL's tail: ``log(−expm1(min(log p, −1e-7)))``, so a side that holds all the mass gets a tail of 1e-7, not 0), and
    a term that is NaN (0·∞) counts 0 (TRL's ``nan_to_num``).

    Args:
        student_logits, teacher_logits: (..., V) as in :func:`generalized_jsd`.
        token_ids: (...) the sampled ids, each < V (an id outside the shared vocabulary: clamp or mask it first).
        temperature, vocab_chunk_size: as in :func:`generalized_jsd`.

    Returns:
        (...) float32. Examples: p_s(y) = 0.5, p_t(y) = 0.9 → 0.5108 (two tokens: equal to the full reverse KL);
        p_s(y) = 0.5, p_t(y) = 1 − 1e-9 → 0.5·ln 0.5 + 0.5·ln(0.5/1e-7) = 7.3659 (TRL's value).
    """
    if student_logits.shape != teacher_logits.shape:
        raise ValueError(f"student logits {tuple(student_logits.shape)} and teacher logits "
                         f"{tuple(teacher_logits.shape)} differ")
    s, t = student_logits.float() / temperature, teacher_logits.float() / temperature
    index = token_ids.unsqueeze(-1)
    log_a = s.gather(-1, index).squeeze(-1) - _log_normaliser(s, vocab_chunk_size)
    log_b = t.gather(-1, index).squeeze(-1) - _log_normaliser(t, vocab_chunk_size)
    log_1ma = torch.log(-torch.expm1(log_a.clamp(max=-1e-7)))
    log_1mb = torch.log(-torch.expm1(log_b.clamp(max=-1e-7)))
    head = torch.nan_to_num(log_a.exp() * (log_a - log_b), nan=0.0)
    tail = torch.nan_to_num(log_1ma.exp() * (log_1ma - log_1mb), nan=0.0)
    return head + tail


def shared_vocab_size(student_tokenizer, teacher_tokenizer) -> int:
    """The number of leading ids both tokenizers define: ``min(len(student), len(teacher))``. An LM head's rows past
    its tokenizer's length are padding (Qwen2.5-VL-7B: 152,064 rows for 151,665 ids) and are left out; a Qwen3
    teacher's extra ids (151,665–151,668: ``<tool_response>``, ``</tool_response>``, ``<think>``, ``</think>``) too.
    Call :func:`tokenizer_mismatch` first: the ids below this size must mean the same strings."""
    return min(len(student_tokenizer), len(teacher_tokenizer))


def tokenizer_mismatch(student_tokenizer, teacher_tokenizer, thinking_free: bool) -> str | None:
    """Why a teacher cannot score a student's tokens, or None when it can.

    Args:
        student_tokenizer, teacher_tokenizer: ``transformers`` tokenizers.
        thinking_free: the prompt template asks for the answer alone (:func:`grounding_rl.prompts.templates.
            is_thinking_free`): chat tokens only one side defines (a Qwen3 teacher's ``<think>``) are then never
            produced by the template nor needed by the answer.

    Returns:
        None, or one sentence: the first shared id the two tokenizers spell differently; or the special tokens only
        one side defines (when the template is not thinking-free).
    """
    student, teacher = student_tokenizer.get_vocab(), teacher_tokenizer.get_vocab()
    shared = shared_vocab_size(student_tokenizer, teacher_tokenizer)
    by_id_student = {i: tok for tok, i in student.items() if i < shared}
    by_id_teacher = {i: tok for tok, i in teacher.items() if i < shared}
    for i in range(shared):
        if by_id_student.get(i) != by_id_teacher.get(i):
            return (f"the tokenizers disagree on shared id {i} (student {by_id_student.get(i)!r}, teacher "
                    f"{by_id_teacher.get(i)!r}): the teacher cannot score the student's tokens")
    if not thinking_free:
        only = sorted(set(student_tokenizer.get_added_vocab()) ^ set(teacher_tokenizer.get_added_vocab()))
        if only:
            return (f"the chat tokens differ ({', '.join(only[:4])} defined by one tokenizer only): choose a "
                    "thinking-free prompt_template (default_no_think, timelens) for this pair")
    return None
