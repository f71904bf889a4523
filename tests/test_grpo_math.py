"""GRPO loss math: the seed's numbers and each loss_type's aggregation."""
import math

import pytest
import torch

from grounding_rl.update import grpo


def ids(n: int, G: int) -> torch.Tensor:
    """Group ids of n rows in groups of G consecutive rows (as the sampler lays them out)."""
    return torch.arange(n) // G


def test_group_advantages_seed_one_group():
    out = grpo.group_advantages(torch.tensor([0.0, 1.6, 5.4, 8.8]), ids(4, 4))
    assert out.advantages.tolist() == pytest.approx([-1.0006, -0.5953, 0.3673, 1.2286], abs=1e-4)
    assert out.std[0].item() == pytest.approx(torch.tensor([0.0, 1.6, 5.4, 8.8]).std().item())  # unbiased
    assert not out.zero_std.any()


def test_group_advantages_seed_two_groups():
    rewards = torch.tensor([0.936, 0.920, 0.800, 0.804, 0.880, 0.856, 0.760, 0.896])
    out = grpo.group_advantages(rewards, ids(8, 4))
    expected = [0.9705, 0.7518, -0.8885, -0.8338, 0.5244, 0.1311, -1.4420, 0.7865]
    assert out.advantages.tolist() == pytest.approx(expected, abs=1e-4)


def test_group_advantages_scale_none_and_batch_and_zero_std():
    rewards = torch.tensor([1.0, 3.0, 2.0, 2.0])
    none = grpo.group_advantages(rewards, ids(4, 2), "none")
    assert none.advantages.tolist() == pytest.approx([-1.0, 1.0, 0.0, 0.0])
    assert none.zero_std.tolist() == [False, False, True, True]
    assert none.group_zero_std.tolist() == [False, False, True, True]
    batch = grpo.group_advantages(rewards, ids(4, 2), "batch")
    std = rewards.std().item()
    assert batch.advantages.tolist() == pytest.approx([-1 / (std + 1e-4), 1 / (std + 1e-4), 0.0, 0.0], rel=1e-5)
    # TRL 1.16: under "batch", frac_reward_zero_std is about the batch std (not 0 here); our drop rule stays per group
    assert batch.zero_std.tolist() == [False] * 4
    assert batch.group_zero_std.tolist() == [False, False, True, True]
    flat = grpo.group_advantages(torch.tensor([2.0, 2.0, 2.0, 2.0]), ids(4, 2), "batch")
    assert flat.zero_std.tolist() == [True] * 4 and flat.group_zero_std.tolist() == [True] * 4


def test_group_advantages_nan_reward_is_left_out():
    out = grpo.group_advantages(torch.tensor([1.0, float("nan"), 3.0, 5.0]), ids(4, 4), "none")
    assert out.advantages.tolist() == pytest.approx([-2.0, 0.0, 0.0, 2.0])


def test_group_advantages_errors():
    with pytest.raises(ValueError, match="shape"):
        grpo.group_advantages(torch.zeros(6), ids(4, 4))
    with pytest.raises(ValueError, match="scale_rewards"):
        grpo.group_advantages(torch.zeros(4), ids(4, 4), "std")
    with pytest.raises(ValueError, match="≥ 2 completions"):
        grpo.group_advantages(torch.zeros(3), torch.tensor([0, 0, 1]))
    # one completion per prompt (distill): every advantage 0, each group's std undefined
    one = grpo.group_advantages(torch.tensor([0.3, 0.9]), ids(2, 1), "none")
    assert one.advantages.tolist() == [0.0, 0.0] and one.group_zero_std.tolist() == [True, True]


def view_advantages(rewards, G, scale_rewards):
    """The advantages as computed before groups were found by id: rows [g·G, (g+1)·G) form group g."""
    from trl.trainer.utils import nanstd

    grouped = rewards.view(-1, G)
    mean = torch.nanmean(grouped, dim=1).repeat_interleave(G)
    std = nanstd(grouped, dim=1).repeat_interleave(G)
    std = nanstd(rewards).expand_as(rewards) if scale_rewards == "batch" else std
    advantages = rewards - mean if scale_rewards == "none" else (rewards - mean) / (std + grpo.ADVANTAGE_EPS)
    return torch.nan_to_num(advantages, nan=0.0)


@pytest.mark.parametrize("scale_rewards", grpo.SCALE_REWARDS)
def test_group_advantages_in_group_order_are_bit_identical_to_the_view(scale_rewards):
    """Rows in group order (ids ascending, or whole groups in any order of ids): the same bits as view(-1, G)."""
    generator = torch.Generator().manual_seed(0)
    rewards = torch.rand(64, generator=generator) * 3 - 1
    rewards[[5, 17, 18]] = float("nan")
    rewards[24:32] = 0.75  # a group of equal rewards
    out = grpo.group_advantages(rewards, ids(64, 8), scale_rewards)
    assert torch.equal(out.advantages, view_advantages(rewards, 8, scale_rewards))
    shuffled_ids = torch.tensor([3, 0, 6, 1, 7, 2, 5, 4]).repeat_interleave(8) + 100  # contiguous, not ascending
    assert torch.equal(grpo.group_advantages(rewards, shuffled_ids, scale_rewards).advantages,
                       view_advantages(rewards, 8, scale_rewards))


@pytest.mark.parametrize("scale_rewards", grpo.SCALE_REWARDS)
def test_group_advantages_follow_rows_shuffled_across_groups(scale_rewards):
    """A batch shuffled row by row across groups (verl's uid grouping): each row keeps its advantage."""
    generator = torch.Generator().manual_seed(1)
    rewards = torch.rand(32, generator=generator)
    rewards[3] = float("nan")
    group_ids = ids(32, 4)
    before = grpo.group_advantages(rewards, group_ids, scale_rewards)
    perm = torch.randperm(32, generator=generator)
    after = grpo.group_advantages(rewards[perm], group_ids[perm], scale_rewards)
    assert not torch.equal(perm, torch.arange(32))
    torch.testing.assert_close(after.advantages, before.advantages[perm])  # up to float32 summation order
    assert torch.equal(after.group_zero_std, before.group_zero_std[perm])
    assert (after.advantages != 0).sum() == 31  # every row but the NaN one has its own non-zero advantage


def test_by_group_pads_unequal_groups_with_nan():
    table, group_of_row = grpo.by_group(torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0]), torch.tensor([7, 3, 7, 3, 7]))
    assert group_of_row.tolist() == [1, 0, 1, 0, 1]
    assert table.nan_to_num(-1).tolist() == [[2.0, 4.0, -1.0], [1.0, 3.0, 5.0]]


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
    out = grpo.grpo_loss(logps, old, adv, mask, ref_logps=ref, beta=0.04, loss_type="bnpo",
                         use_bias_correction_kl=False)
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


def _stale_micro_steps(accumulation: int, steps_per_generation: int, iterations: int, micro_steps: int) -> list[int]:
    """Walk the schedule: micro-step s trains on generation s // (spg · μ), produced just before micro-step
    (s // (spg · μ)) · spg · μ; optimizer steps follow micro-steps k · accumulation − 1. Stale = an optimizer step
    happened between the generation and s."""
    every = steps_per_generation * iterations
    stale = []
    for s in range(micro_steps):
        generated_at = (s // every) * every
        last_optimizer_boundary = (s // accumulation) * accumulation  # micro-steps before it were stepped
        if last_optimizer_boundary > generated_at:
            stale.append(s)
    return stale


@pytest.mark.parametrize("accumulation", [1, 2, 3, 4])
@pytest.mark.parametrize("steps_per_generation", [1, 2, 3, 4])
@pytest.mark.parametrize("iterations", [1, 2, 3, 4])
def test_old_logps_are_stored_exactly_when_a_micro_step_is_stale(accumulation, steps_per_generation, iterations):
    """TRL 1.16's rule: every micro-step whose batch was generated before the latest optimizer step has stored π_old
    log-probs, and none are computed when no micro-step is stale."""
    stale = _stale_micro_steps(accumulation, steps_per_generation, iterations, micro_steps=5 * 48)
    assert grpo.needs_old_logps(accumulation, steps_per_generation, iterations) == bool(stale)
    assert grpo.needs_old_logps(accumulation, steps_per_generation, iterations, engine_logps_need_correcting=True)


def test_old_logps_rule_cases():
    # accepted by the config, and the case the old rule (num_iterations > 1 or spg > accumulation) missed
    assert grpo.needs_old_logps(3, 2, 1) and _stale_micro_steps(3, 2, 1, 6) == [3]
    assert not grpo.needs_old_logps(4, 2, 2) and not grpo.needs_old_logps(2, 1, 2)  # old rule computed these
    assert grpo.needs_old_logps(1, 2, 1)


def test_bias_corrected_kl_gradient_is_trls():
    """TRL 1.16 (use_bias_correction_kl=True): per_token_kl = k3 · exp(logp − old), added as β·kl. On-policy the ratio
    is 1 in value but its gradient turns β·(1 − e^δ) into β·(logp − ref), δ = ref − logp."""
    torch.manual_seed(0)
    logps = (torch.randn(3, 5) - 1).requires_grad_(True)
    ref = logps.detach() + 0.3 * torch.randn(3, 5)
    adv = torch.tensor([0.5, -1.0, 2.0])
    mask = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1], [1, 1, 0, 0, 0]])
    beta = 0.04
    out = grpo.grpo_loss(logps, logps.detach(), adv, mask, ref_logps=ref, beta=beta, loss_type="bnpo")
    (grad,) = torch.autograd.grad(out.loss, logps)

    # TRL's formula, line by line (trl/trainer/grpo_trainer.py, _compute_loss)
    trl_logps = logps.detach().clone().requires_grad_(True)
    coef_1 = torch.exp(trl_logps - trl_logps.detach())
    per_token_kl = (torch.exp(ref - trl_logps) - (ref - trl_logps) - 1) * coef_1
    coef_2 = torch.clamp(coef_1, 1 - 0.2, 1 + 0.2)
    per_token_loss = -torch.min(coef_1 * adv.unsqueeze(1), coef_2 * adv.unsqueeze(1)) + beta * per_token_kl
    trl_loss = (per_token_loss * mask).sum() / mask.sum().clamp(min=1.0)
    (trl_grad,) = torch.autograd.grad(trl_loss, trl_logps)
    assert torch.equal(grad, trl_grad) and torch.equal(out.loss, trl_loss)

    n = mask.sum()
    expected = (-adv.unsqueeze(1) + beta * (logps.detach() - ref)) * mask / n
    assert torch.allclose(grad, expected, atol=1e-7)
    plain = grpo.grpo_loss(logps, logps.detach(), adv, mask, ref_logps=ref, beta=beta, loss_type="bnpo",
                           use_bias_correction_kl=False)
    (plain_grad,) = torch.autograd.grad(plain.loss, logps)
    expected_plain = (-adv.unsqueeze(1) + beta * (1 - torch.exp(ref - logps.detach()))) * mask / n
    assert torch.allclose(plain_grad, expected_plain, atol=1e-7)
    assert not torch.allclose(plain_grad, grad, atol=1e-5)


def test_dapo_normaliser_clamps_before_dividing():
    # TRL 1.16: num_items_in_batch.clamp(min=1) / processes · accumulation / steps_per_generation
    assert grpo.dapo_normaliser(torch.tensor(0), 4, 2, 2).item() == pytest.approx(0.25)
    assert grpo.dapo_normaliser(torch.tensor(40), 4, 3, 2).item() == pytest.approx(15.0)
    loss = torch.ones(1, 2)
    mask = torch.zeros(1, 2)
    assert grpo.aggregate_loss(loss, mask, "dapo", num_items=grpo.dapo_normaliser(torch.tensor(0), 4, 1, 1)).item() == 0


def test_loss_is_aggregated_in_float32_for_a_bf16_model():
    logps = torch.tensor([[-0.5, -1.25, -2.0]], dtype=torch.bfloat16)
    mask = torch.tensor([[1, 1, 0]])
    for loss_type in grpo.LOSS_TYPES:
        out = grpo.grpo_loss(logps, logps, torch.tensor([0.3], dtype=torch.bfloat16), mask, loss_type=loss_type,
                             max_completion_length=3, ref_logps=logps - 0.1, beta=0.1)
        assert out.loss.dtype == torch.float32
    per_token = torch.full((1, 300), 0.01, dtype=torch.bfloat16)
    assert grpo.aggregate_loss(per_token, torch.ones(1, 300), "dr_grpo", max_completion_length=300).item() \
        == pytest.approx(float(torch.tensor(0.01, dtype=torch.bfloat16)), rel=1e-6)


def test_injected_rows_are_the_last_of_each_group():
    from grounding_rl.update.grpo import injected_rows

    assert injected_rows(0, 8, 4).tolist() == [False, False, False, True] * 2
    # a process holding global rows 2..5 of groups of 4: only global row 3 ends a group
    assert injected_rows(2, 4, 4).tolist() == [False, True, False, False]


def test_kept_groups_are_those_with_reward_spread():
    from grounding_rl.update.grpo import kept_groups

    zero_std = torch.tensor([True, True, False, False, True, True, False, False])
    assert kept_groups(zero_std, ids(8, 2)) == [1, 3]
    assert kept_groups(torch.ones(4, dtype=torch.bool), ids(4, 2)) == []
    # by id, in the order of each group's first row, the rows in any order
    assert kept_groups(zero_std[[2, 0, 6, 1, 3, 7, 4, 5]], (ids(8, 2) + 10)[[2, 0, 6, 1, 3, 7, 4, 5]]) == [11, 13]
    with pytest.raises(ValueError, match="shape"):
        kept_groups(torch.zeros(3, dtype=torch.bool), ids(4, 2))


# --- engine importance-sampling correction (TRL 1.16 vllm_importance_sampling_*), hand-computed
OLD = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -0.2, 0.0]])
ENGINE = torch.tensor([[-1.1, -2.3, -9.0], [-0.3, -2.0, 0.0]])
MASK = torch.tensor([[1, 1, 0], [1, 1, 0]])


def test_engine_weights_sequence_mask_default():
    out = grpo.engine_importance_weights(OLD, ENGINE, MASK)  # sequence_mask, clip_max 3.0
    # row 0: exp(0.1 + 0.3) = 1.4918 (the masked token's 8.5 ignored); row 1: exp(1.8) = 6.05 > 3 → masked to 0
    assert out.weights.shape == (2, 1)
    assert out.weights.flatten().tolist() == pytest.approx([1.491825, 0.0], abs=1e-5)
    assert out.logp_difference_mean == pytest.approx((0.1 + 0.3 + 0.0 + 1.8) / 4, abs=1e-6)
    assert out.logp_difference_max == pytest.approx(1.8, abs=1e-6)
    assert (out.ratio_min, out.ratio_mean, out.ratio_max) == pytest.approx((0.0, 0.745912, 1.491825), abs=1e-5)


def test_engine_weights_truncate_and_token_modes():
    seq = grpo.engine_importance_weights(OLD, ENGINE, MASK, mode="sequence_truncate", clip_min=1.2)
    assert seq.weights.flatten().tolist() == pytest.approx([1.491825, 3.0], abs=1e-5)
    tok = grpo.engine_importance_weights(OLD, ENGINE, MASK, mode="token_mask")
    # exp(0.1), exp(0.3), masked token 1 (difference zeroed); row 1: 1, exp(1.8) → 0, 1
    assert tok.weights.flatten().tolist() == pytest.approx([1.105171, 1.349859, 1.0, 1.0, 0.0, 1.0], abs=1e-5)
    assert tok.ratio_mean == pytest.approx((1.105171 + 1.349859 + 1.0 + 0.0) / 4, abs=1e-5)
    trunc = grpo.engine_importance_weights(OLD, ENGINE, MASK, mode="token_truncate", clip_min=1.2, clip_max=None)
    assert trunc.weights.flatten().tolist() == pytest.approx([1.2, 1.349859, 1.2, 1.2, 6.049647, 1.2], abs=1e-5)


def test_engine_weights_nan_engine_logp_counts_as_no_correction():
    engine = ENGINE.clone()
    engine[0, 1] = float("nan")
    out = grpo.engine_importance_weights(OLD, engine, MASK, mode="token_mask")
    assert out.weights[0].tolist() == pytest.approx([1.105171, 1.0, 1.0], abs=1e-5)
    assert out.logp_difference_max == pytest.approx(1.8, abs=1e-6)
    assert out.logp_difference_mean == pytest.approx((0.1 + 0.0 + 1.8) / 3, abs=1e-6)
    with pytest.raises(ValueError, match="vllm_importance_sampling_mode"):
        grpo.engine_importance_weights(OLD, ENGINE, MASK, mode="sequence")


def test_grpo_loss_importance_weights_scale_surrogate_not_kl():
    logps = torch.zeros(2, 2)
    weights = torch.tensor([[0.5], [0.0]])
    out = grpo.grpo_loss(logps, logps, torch.tensor([1.0, -1.0]), torch.ones(2, 2), loss_type="bnpo",
                         importance_weights=weights)
    assert out.loss.item() == pytest.approx((-0.5 * 2 + 0.0) / 4)
    kl = grpo.grpo_loss(logps, logps, torch.tensor([1.0, -1.0]), torch.ones(2, 2), loss_type="bnpo",
                        ref_logps=torch.full((2, 2), -0.5), beta=0.1, importance_weights=torch.zeros(2, 1))
    assert kl.loss.item() == pytest.approx(0.1 * (math.exp(-0.5) + 0.5 - 1), abs=1e-7)  # k3 unweighted
