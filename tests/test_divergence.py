"""The per-token divergences of on-policy distillation against hand-computed values and gradients."""
import math

import pytest
import torch

from grounding_rl.update import divergence

# p_s = (0.5, 0.5), p_t = (0.9, 0.1)
STUDENT = torch.tensor([[math.log(0.5), math.log(0.5)]])
TEACHER = torch.tensor([[math.log(0.9), math.log(0.1)]])


@pytest.mark.parametrize("beta, value, grad0", [
    # 0.5·ln(0.5/0.9) + 0.5·ln(0.5/0.1); d/dz_0 = p_s0·(ln(p_s0/p_t0) − KL)
    (1.0, 0.5108256, 0.5 * (math.log(0.5 / 0.9) - 0.5108256)),
    # 0.9·ln(0.9/0.5) + 0.1·ln(0.1/0.5); d/dz_0 = p_s0 − p_t0
    (0.0, 0.3680642, -0.4),
    # m = (0.7, 0.3): 0.5·KL(p_t‖m) + 0.5·KL(p_s‖m); d/dz_0 = 0.5·p_s0·(ln(p_s0/m_0) − KL(p_s‖m))
    (0.5, 0.5 * (0.1163218 + 0.0871771), 0.25 * (math.log(0.5 / 0.7) - 0.0871771)),
])
def test_generalized_jsd_values_and_gradients(beta, value, grad0):
    student = STUDENT.clone().requires_grad_(True)
    loss = divergence.generalized_jsd(student, TEACHER, beta)
    assert loss.item() == pytest.approx(value, abs=1e-6)
    loss.sum().backward()
    assert student.grad[0, 0].item() == pytest.approx(grad0, abs=1e-6)
    assert student.grad[0, 1].item() == pytest.approx(-grad0, abs=1e-6)  # softmax gradients sum to 0


def test_chunking_over_the_vocabulary_changes_nothing():
    gen = torch.Generator().manual_seed(0)
    s, t = torch.randn(3, 4, 7, generator=gen), torch.randn(3, 4, 7, generator=gen)
    for beta in (0.0, 0.3, 1.0):
        whole = divergence.generalized_jsd(s, t, beta, temperature=0.7, vocab_chunk_size=7)
        chunked = divergence.generalized_jsd(s, t, beta, temperature=0.7, vocab_chunk_size=3)
        assert torch.allclose(whole, chunked, atol=1e-6)
        assert (whole > 0).all()


def test_temperature_divides_both_logits():
    s, t = STUDENT * 2.0, TEACHER * 2.0
    assert divergence.generalized_jsd(s, t, 1.0, temperature=2.0).item() == pytest.approx(0.5108256, abs=1e-6)


def test_teacher_equal_to_student_gives_zero_loss_and_gradient():
    logits = torch.randn(2, 5, 11, generator=torch.Generator().manual_seed(1))
    for beta in (0.0, 0.5, 1.0):
        student = logits.clone().requires_grad_(True)
        loss = divergence.generalized_jsd(student, logits, beta)
        loss.sum().backward()
        assert loss.abs().max().item() < 1e-6
        assert student.grad.abs().max().item() < 1e-6


def test_top1_reverse_kl_with_tail_bucket():
    # two tokens: {sampled, tail} is the whole vocabulary, so it equals the full reverse KL
    assert divergence.top1_reverse_kl(STUDENT, TEACHER, torch.tensor([0])).item() == pytest.approx(0.5108256, abs=1e-6)
    # three tokens, p_s = (0.5, 0.25, 0.25), p_t = (0.8, 0.1, 0.1), sampled 0: 0.5·ln(0.5/0.8) + 0.5·ln(0.5/0.2)
    s = torch.tensor([[math.log(0.5), math.log(0.25), math.log(0.25)]])
    t = torch.tensor([[math.log(0.8), math.log(0.1), math.log(0.1)]])
    expected = 0.5 * math.log(0.5 / 0.8) + 0.5 * math.log(0.5 / 0.2)
    assert divergence.top1_reverse_kl(s, t, torch.tensor([0])).item() == pytest.approx(expected, abs=1e-6)


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="beta"):
        divergence.generalized_jsd(STUDENT, TEACHER, 1.5)
    with pytest.raises(ValueError, match="shared vocabulary"):
        divergence.generalized_jsd(STUDENT, torch.zeros(1, 3), 1.0)


class _Tok:
    def __init__(self, vocab, added=()):
        self.vocab, self.added = vocab, {a: vocab[a] for a in added}

    def __len__(self):
        return len(self.vocab)

    def get_vocab(self):
        return dict(self.vocab)

    def get_added_vocab(self):
        return dict(self.added)


def test_tokenizer_rules():
    base = {"a": 0, "b": 1, "<|im_start|>": 2}
    student = _Tok(base, added=["<|im_start|>"])
    qwen3 = _Tok({**base, "<think>": 3}, added=["<|im_start|>", "<think>"])
    assert divergence.shared_vocab_size(student, qwen3) == 3
    assert divergence.tokenizer_mismatch(student, _Tok(base, added=["<|im_start|>"]), thinking_free=False) is None
    assert "<think>" in divergence.tokenizer_mismatch(student, qwen3, thinking_free=False)
    assert divergence.tokenizer_mismatch(student, qwen3, thinking_free=True) is None
    swapped = _Tok({"b": 0, "a": 1, "<|im_start|>": 2}, added=["<|im_start|>"])
    assert "shared id 0" in divergence.tokenizer_mismatch(student, swapped, thinking_free=True)


# ------------------------------------------------------------------------------------------------ float32 logits
def _bf16_logits(seed: int, shape=(3, 5, 1000), scale: float = 4.0) -> torch.Tensor:
    return (torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale).bfloat16()


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("which", ["jsd0", "jsd0.5", "jsd1", "top1"])
def test_bf16_logits_give_the_float32_computation(which, temperature):
    """bf16 logits are cast to float32 before the temperature divides them: the value is the float32 computation's
    on the same numbers (equal), and the gradient is the float32 gradient, rounded once to the input's bf16 (equal to
    ``float32_grad.bfloat16()``; that one rounding is ≤ 2⁻⁹ relative per element)."""
    student, teacher = _bf16_logits(0), _bf16_logits(1)
    ids = torch.randint(0, 1000, (3, 5), generator=torch.Generator().manual_seed(2))

    def f(s, t):
        if which == "top1":
            return divergence.top1_reverse_kl(s, t, ids, temperature)
        return divergence.generalized_jsd(s, t, float(which[3:]), temperature)

    low, high = student.clone().requires_grad_(True), student.float().requires_grad_(True)
    value_low, value_high = f(low, teacher), f(high, teacher.float())
    value_low.sum().backward()
    value_high.sum().backward()
    assert value_low.dtype == torch.float32
    assert torch.allclose(value_low, value_high, rtol=1e-6, atol=0)
    assert torch.equal(low.grad, high.grad.bfloat16())


def test_float32_logits_is_trls_projection():
    """:func:`divergence.float32_logits` against TRL 1.16's ``_project`` (``trl/kernels/chunked_divergence.py``) on
    bf16 hidden states and a bf16 head with a bias, folded in chunks smaller than the vocabulary; its gradients against
    autograd through ``hidden.float() @ weight.float().T``."""
    from trl.kernels.chunked_divergence import _project

    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(2, 3, 16, generator=gen).bfloat16()
    weight, bias = torch.randn(50, 16, generator=gen).bfloat16(), torch.randn(50, generator=gen).bfloat16()
    expected = torch.empty(6, 50)
    _project(expected, hidden.reshape(6, 16), weight, bias, 0, 50, torch.bfloat16)
    h, w, b = (x.clone().requires_grad_(True) for x in (hidden, weight, bias))
    logits = divergence.float32_logits(h, w, b, vocab_chunk_size=7)
    assert logits.dtype == torch.float32 and logits.shape == (2, 3, 50)
    assert torch.allclose(logits.reshape(6, 50), expected, rtol=1e-6, atol=1e-6)  # up to the order of the sums
    upstream = torch.randn(2, 3, 50, generator=gen)
    (logits * upstream).sum().backward()
    h2, w2, b2 = (x.float().requires_grad_(True) for x in (hidden, weight, bias))
    ((h2 @ w2.T + b2) * upstream).sum().backward()
    for ours, theirs, x in ((h.grad, h2.grad, hidden), (w.grad, w2.grad, weight), (b.grad, b2.grad, bias)):
        assert ours.dtype == x.dtype
        assert torch.allclose(ours.float(), theirs.bfloat16().float(), rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("beta, temperature", [(0.0, 1.0), (0.5, 0.7), (1.0, 0.7), (1.0, 1.0)])
def test_distill_term_on_a_bf16_model_equals_trls_chunked_divergence(bpe_tiny_model_dir, tmp_path_factory, beta,
                                                                   temperature):
    """The ``distill`` path on a tiny model loaded in bf16 (student: the tiny model; teacher: its weights re-drawn):
    :func:`completion_logps` with ``return_logits`` (the LM head under ``float32_head``) and
    :func:`per_token_divergence`, token-averaged, against TRL 1.16's ``_chunked_divergence_loss``
    (``trl/trainer/distillation_trainer.py``) on the same last hidden states and LM-head weights: the loss and its
    gradient with respect to the student's last hidden states within 1e-3 relative."""
    from conftest import make_noisy_model
    from trl.trainer.distillation_trainer import _chunked_divergence_loss

    from grounding_rl.models.loading import load_policy
    from grounding_rl.update.logprobs import completion_logps
    from grounding_rl.update.recipes.distillation import per_token_divergence

    teacher_dir = tmp_path_factory.mktemp("teacher")
    make_noisy_model(bpe_tiny_model_dir, teacher_dir)
    student = load_policy(str(bpe_tiny_model_dir), dtype="bfloat16")
    teacher = load_policy(str(teacher_dir), dtype="bfloat16").requires_grad_(False)
    gen = torch.Generator().manual_seed(0)
    vocab = student.get_output_embeddings().weight.size(0)
    prompt_ids, completion_ids = torch.randint(0, 200, (2, 6), generator=gen), torch.randint(0, vocab, (2, 5),
                                                                                               generator=gen)
    completion_mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    batch = {"prompt_ids": prompt_ids, "prompt_mask": torch.ones_like(prompt_ids), "completion_ids": completion_ids,
             "completion_mask": completion_mask, "mm_token_type_ids": torch.zeros_like(prompt_ids)}
    hidden = {}

    def keep(name):
        def hook(module, args):
            hidden[name] = args[0]
            if args[0].requires_grad:
                args[0].retain_grad()
        return hook

    handles = [student.get_output_embeddings().register_forward_pre_hook(keep("student")),
               teacher.get_output_embeddings().register_forward_pre_hook(keep("teacher"))]
    logps, student_logits = completion_logps(student, batch, temperature, return_logits=True)
    with torch.no_grad():
        _, teacher_logits = completion_logps(teacher, batch, temperature, return_logits=True)
    for handle in handles:
        handle.remove()
    assert student_logits.dtype == torch.float32 and logps.dtype == torch.bfloat16
    with torch.no_grad():  # the GRPO log-probs of that forward are those of a plain one (π_old, π_ref)
        plain = completion_logps(student, batch, temperature)
    assert torch.equal(logps.detach(), plain)
    per_token = per_token_divergence(student_logits, teacher_logits, completion_ids, vocab, beta, 0, temperature)
    loss = (per_token * completion_mask).sum() / completion_mask.sum()
    loss.backward()
    ours = hidden["student"].grad[:, :-1]  # the last kept position predicts no completion token

    h_s = hidden["student"].detach()[:, :-1].clone().requires_grad_(True)
    theirs, _, _ = _chunked_divergence_loss(h_s, hidden["teacher"][:, :-1], student.get_output_embeddings().weight,
                                            teacher.get_output_embeddings().weight, completion_mask, beta,
                                            temperature=temperature)
    theirs.backward()
    assert loss.item() == pytest.approx(theirs.item(), rel=1e-3)
    # the model path's gradient reaches the bf16 hidden states rounded to bf16, as TRL's does; two bf16 roundings of
    # float32 sums may land on neighbouring steps, so here the bound is bf16's (the norm of the difference)
    ours, theirs_grad = ours.float(), h_s.grad.float()
    assert ((ours - theirs_grad).norm() / theirs_grad.norm()).item() < 5e-3
    # before that last rounding: the model path's logits are float32_logits of its hidden states, and on float32
    # copies of those hidden states the term and its gradient equal TRL's within 1e-3 relative
    weights = student.get_output_embeddings().weight, teacher.get_output_embeddings().weight
    assert torch.equal(student_logits, divergence.float32_logits(hidden["student"][:, :-1], weights[0]))
    h32 = hidden["student"].detach()[:, :-1].float().requires_grad_(True)
    t32 = hidden["teacher"][:, :-1].float()
    per_token = per_token_divergence(divergence.float32_logits(h32, weights[0]),
                                     divergence.float32_logits(t32, weights[1]), completion_ids, vocab, beta, 0,
                                     temperature)
    loss = (per_token * completion_mask).sum() / completion_mask.sum()
    loss.backward()
    h32_trl = h32.detach().clone().requires_grad_(True)
    theirs, _, _ = _chunked_divergence_loss(h32_trl, t32, *weights, completion_mask, beta, temperature=temperature)
    theirs.backward()
    assert loss.item() == pytest.approx(theirs.item(), rel=1e-3)
    assert ((h32.grad - h32_trl.grad).norm() / h32_trl.grad.norm()).item() < 1e-3


# ------------------------------------------------------------------------------------------------ top-1 against TRL
def _trl_top1(student_logits, teacher_logits, ids, temperature):
    """TRL 1.16's ``ServerDistillationTrainer._compute_sparse_top_1_divergence_loss`` (β = 1, ``loss_add_tail``;
    ``trl/experimental/server_distillation/server_distillation_trainer.py``) on full-vocabulary log-probs, token
    mean."""
    from types import SimpleNamespace

    from trl.experimental.server_distillation.server_distillation_trainer import ServerDistillationTrainer as T

    student_logps = torch.log_softmax(student_logits / temperature, dim=-1)
    teacher_logps = torch.log_softmax(teacher_logits / temperature, dim=-1)
    this = SimpleNamespace(beta=1.0, loss_add_tail=True, _reduce_divergence_loss=T._reduce_divergence_loss)
    top1 = teacher_logps.max(-1)
    return T._compute_sparse_top_1_divergence_loss(
        this, student_logps, top1.indices, top1.values, ids, teacher_logps.gather(-1, ids.unsqueeze(-1)).squeeze(-1),
        torch.zeros_like(ids))


def _logits_with(p_sampled: float, vocab: int = 5) -> torch.Tensor:
    """Logits whose softmax gives token 0 probability ``p_sampled`` (float64 to place it), the rest spread evenly."""
    rest = (1 - p_sampled) / (vocab - 1)
    return torch.tensor([math.log(p_sampled)] + [math.log(rest)] * (vocab - 1), dtype=torch.float64).float()


@pytest.mark.parametrize("p_student, p_teacher", [
    (0.5, 1 - 1e-9), (0.5, 1 - 1e-12), (0.3, 1 - 1e-7), (1 - 1e-9, 0.5), (0.5, 0.9), (0.2, 0.01)])
def test_top1_reverse_kl_equals_trls_on_saturated_and_ordinary_teachers(p_student, p_teacher):
    """Value and gradient against TRL's function, where the teacher (or the student) holds the sampled token's
    probability above 1 − 1.2e-7 (TRL clamps log p ≤ −1e-7 before the tail: a tail of 1e-7) and where it does not.
    p_s = 0.5, p_t = 1 − 1e-9: 0.5·ln 0.5 + 0.5·ln(0.5 / 1e-7) = 7.3659."""
    student, teacher, ids = _logits_with(p_student).view(1, 1, -1), _logits_with(p_teacher).view(1, 1, -1), \
        torch.zeros(1, 1, dtype=torch.long)
    ours_in, theirs_in = student.clone().requires_grad_(True), student.clone().requires_grad_(True)
    ours, theirs = divergence.top1_reverse_kl(ours_in, teacher, ids), _trl_top1(theirs_in, teacher, ids, 1.0)
    ours.sum().backward()
    theirs.backward()
    assert ours.item() == pytest.approx(theirs.item(), rel=1e-6, abs=1e-7)
    assert torch.allclose(ours_in.grad, theirs_in.grad, rtol=1e-5, atol=1e-7)
    if (p_student, p_teacher) == (0.5, 1 - 1e-9):
        assert ours.item() == pytest.approx(0.5 * math.log(0.5) + 0.5 * math.log(0.5 / 1e-7), abs=1e-4)  # 7.3659


def test_top1_reverse_kl_equals_trls_on_random_logits():
    gen = torch.Generator().manual_seed(3)
    student, teacher = torch.randn(4, 6, 50, generator=gen) * 3, torch.randn(4, 6, 50, generator=gen) * 3
    teacher[0, :, :] = 0.0
    teacher[0, :, 7] = 40.0  # a saturated teacher on row 0
    ids = torch.randint(0, 50, (4, 6), generator=gen)
    ids[0] = 7
    for temperature in (1.0, 0.7):
        ours_in, theirs_in = student.clone().requires_grad_(True), student.clone().requires_grad_(True)
        ours = divergence.top1_reverse_kl(ours_in, teacher, ids, temperature).mean()
        theirs = _trl_top1(theirs_in, teacher, ids, temperature)
        ours.backward()
        theirs.backward()
        assert ours.item() == pytest.approx(theirs.item(), rel=1e-6)
        assert torch.allclose(ours_in.grad, theirs_in.grad, rtol=1e-5, atol=1e-8)
