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
