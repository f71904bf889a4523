"""GRPO loss math: the seed's numbers and each loss_type's aggregation."""
import pytest
import torch

from grounding_rl.update import grpo


def test_group_advantages_seed_one_group():
    out = grpo.group_advantages(torch.tensor([0.0, 1.6, 5.4, 8.8]), num_generations=4)
    assert out.advantages.tolist() == pytest.approx([-1.0006, -0.5953, 0.3673, 1.2286], abs=1e-4)
    assert out.std[0].item() == pytest.approx(torch.tensor([0.0, 1.6, 5.4, 8.8]).std().item())  # unbiased
    assert not out.zero_std.any()


def test_group_advantages_seed_two_groups():
    rewards = torch.tensor([0.936, 0.920, 0.800, 0.804, 0.880, 0.856, 0.760, 0.896])
    out = grpo.group_advantages(rewards, num_generations=4)
    expected = [0.9705, 0.7518, -0.8885, -0.8338, 0.5244, 0.1311, -1.4420, 0.7865]
    assert out.advantages.tolist() == pytest.approx(expected, abs=1e-4)


def test_group_advantages_scale_none_and_batch_and_zero_std():
    rewards = torch.tensor([1.0, 3.0, 2.0, 2.0])
    none = grpo.group_advantages(rewards, 2, "none")
    assert none.advantages.tolist() == pytest.approx([-1.0, 1.0, 0.0, 0.0])
    assert none.zero_std.tolist() == [False, False, True, True]
    batch = grpo.group_advantages(rewards, 2, "batch")
    std = rewards.std().item()
    assert batch.advantages.tolist() == pytest.approx([-1 / (std + 1e-4), 1 / (std + 1e-4), 0.0, 0.0], rel=1e-5)


def test_group_advantages_nan_reward_is_left_out():
    out = grpo.group_advantages(torch.tensor([1.0, float("nan"), 3.0, 5.0]), 4, "none")
    assert out.advantages.tolist() == pytest.approx([-2.0, 0.0, 0.0, 2.0])


def test_group_advantages_errors():
    with pytest.raises(ValueError, match="multiple of 4"):
        grpo.group_advantages(torch.zeros(6), 4)
    with pytest.raises(ValueError, match="scale_rewards"):
        grpo.group_advantages(torch.zeros(4), 4, "std")


def test_ratio_clip_and_kl_seed():
    ratio = grpo.importance_ratio(torch.tensor([[-0.2]]), torch.tensor([[-0.5]]))
    assert ratio.item() == pytest.approx(1.3499, abs=1e-4)
    obj = grpo.clipped_surrogate(torch.tensor([[1.35]]), torch.tensor([1.5]), 0.2)
    assert obj.item() == pytest.approx(1.8)
    # negative advantage: the pessimistic side is the unclipped ratio
    assert grpo.clipped_surrogate(torch.tensor([[1.35]]), torch.tensor([-1.5]), 0.2).item() == pytest.approx(-2.025)
    # asymmetric range (DAPO's clip-higher)
    assert grpo.clipped_surrogate(torch.tensor([[1.35]]), torch.tensor([1.0]), 0.2, 0.28).item() == pytest.approx(1.28)
    assert grpo.k3_kl(torch.tensor([-0.2]), torch.tensor([-0.5])).item() == pytest.approx(0.0408, abs=1e-4)
    assert grpo.k3_kl(torch.tensor([-0.3]), torch.tensor([-0.3])).item() == 0.0


def test_aggregation_per_loss_type():
    loss = torch.tensor([[1.0, 2.0, 3.0, 0.0], [4.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]])
    assert grpo.aggregate_loss(loss, mask, "grpo").item() == pytest.approx((2.0 + 4.0) / 2)
    assert grpo.aggregate_loss(loss, mask, "bnpo").item() == pytest.approx(10.0 / 4)
    assert grpo.aggregate_loss(loss, mask, "dr_grpo", max_completion_length=8).item() == pytest.approx(10.0 / 16)
    assert grpo.aggregate_loss(loss, mask, "dapo", num_items=20).item() == pytest.approx(0.5)
    assert grpo.aggregate_loss(loss, mask, "dapo").item() == pytest.approx(2.5)
    with pytest.raises(ValueError, match="loss_type"):
        grpo.aggregate_loss(loss, mask, "ppo")


def test_grpo_loss_gradient_and_clip_flags():
    logps = torch.tensor([[-0.2, -1.0], [-0.1, -2.0]], requires_grad=True)
    old = torch.tensor([[-0.5, -1.0], [-0.1, -1.5]])
    ref = torch.tensor([[-0.5, -1.0], [-0.1, -2.0]])
    adv = torch.tensor([1.5, -1.0])
    mask = torch.ones(2, 2)
    out = grpo.grpo_loss(logps, old, adv, mask, ref_logps=ref, beta=0.04, loss_type="bnpo")
    # token (0,0): ratio 1.35 > 1.2 with A > 0 → high-clipped; token (1,1): ratio exp(-0.5)=0.61 < 0.8 with A < 0
    assert out.high_clipped.tolist() == [[True, False], [False, False]]
    assert out.low_clipped.tolist() == [[False, False], [False, True]]
    assert out.region_clipped.sum().item() == 2
    # low-clipped token (1,1): min(0.61·(−1), 0.8·(−1)) = −0.8 → loss +0.8
    expected = (-1.8 - 1.5 + 1.0 + 0.8 + 0.04 * 0.0408182) / 4
    assert out.loss.item() == pytest.approx(expected, abs=1e-5)
    out.loss.backward()
    # a clipped token has zero surrogate gradient; only its KL term remains
    kl_grad = 0.04 * (1 - torch.exp(torch.tensor(-0.3))).item() / 4
    assert logps.grad[0, 0].item() == pytest.approx(kl_grad, abs=1e-6)
    assert logps.grad[0, 1].item() == pytest.approx(-1.5 / 4, abs=1e-6)  # −A·ρ/4 with ρ = 1
    assert logps.grad[1, 1].item() == 0.0  # low-clipped: no gradient
    with pytest.raises(ValueError, match="ref"):
        grpo.grpo_loss(logps, old, adv, mask, beta=0.1)


def test_masked_sum_count():
    assert grpo.masked_sum_count(torch.tensor([[1.0, 5.0]]), torch.tensor([[1, 0]])).tolist() == [1.0, 1.0]
