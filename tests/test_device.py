"""The checks that depend on the device and dtype, on ``$GROUNDING_RL_TEST_DEVICE`` (``cuda`` in
scripts/gpu_check.sh): the sign of the update, 3D RoPE position ids in generation and both forwards, one vision
encoding per clip against per-row encoding in fp32 and bf16, and the reference model.

Unset, the device is the CPU and only the bf16 equivalence runs: the fp32 versions of the others run on CPU in
tests/test_trainer.py and tests/test_sharing.py. Tolerances: fp32 (TF32 off) as on CPU, 1e-5; bf16 (8 mantissa bits,
relative step 2**-8 ≈ 0.4 %): per-token log-probs within 0.05 absolute (log-probs near log(1/V) ≈ -12 for a random
model), the loss within 1 %, the flattened gradient's cosine similarity ≥ 0.99.
"""
from __future__ import annotations

import copy
import dataclasses
import os

import pytest
import torch

from conftest import MAKEUP, POOL, clip_dataset, grpo_config, make_grpo_trainer

from grounding_rl.data.video import VideoSettings, sample_frames
from grounding_rl.models.loading import load_policy, load_processor, vision_tower
from grounding_rl.update import batching
from grounding_rl.update.config import GroundingGRPOConfig
from grounding_rl.update.logprobs import completion_logps

torch.set_num_threads(1)

DEVICE = os.environ.get("GROUNDING_RL_TEST_DEVICE", "")
ON_CPU_ELSEWHERE = pytest.mark.skipif(
    not DEVICE, reason="runs on CPU in test_trainer.py / test_sharing.py; set GROUNDING_RL_TEST_DEVICE=cuda")
DEVICE = DEVICE or "cpu"
if DEVICE.startswith("cuda") and not torch.cuda.is_available():
    pytest.skip(f"GROUNDING_RL_TEST_DEVICE={DEVICE} but CUDA is not available", allow_module_level=True)
SETTINGS = VideoSettings(fps=1.0, min_pixels=3136, max_pixels=28 * 28 * 16)
# per-row policy and reference forwards where the config can pack each group's prompt into one row
# (share_prompt_prefix): packed rows carry other position-id shapes, checked in tests/test_sharing.py. A renamed or
# removed field stops this module at collection, on every device, instead of silently switching these tests to
# another path.
PER_ROW_FORWARD = {"share_prompt_prefix": False}
_UNKNOWN = set(PER_ROW_FORWARD) - {f.name for f in dataclasses.fields(GroundingGRPOConfig)}
if _UNKNOWN:
    raise AssertionError(f"tests/test_device.py forces {sorted(_UNKNOWN)}, which GroundingGRPOConfig no longer has")
ROWS = [0, 1, 0, 0, 1]  # two clips, uneven rows


@pytest.fixture(autouse=True)
def _no_tf32():
    """fp32 means fp32: cuDNN's TF32 convolutions (the patch embedding) would round to 10 mantissa bits."""
    if not torch.cuda.is_available():
        yield
        return
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


def _trainer(tmp_path, model_dir, videos_dir, **overrides):
    config = grpo_config(tmp_path / "out", **{"use_cpu": DEVICE == "cpu", **overrides})
    return make_grpo_trainer(model_dir, config, clip_dataset(videos_dir, (POOL, MAKEUP)))


def _summed_logp(model, batch):
    with torch.no_grad():
        return (completion_logps(model, batch) * batch["completion_mask"]).sum().item()


@ON_CPU_ELSEWHERE
def test_sign_of_the_update_follows_the_advantage(tmp_path, tiny_model_dir, videos_dir):
    trainer = _trainer(tmp_path, tiny_model_dir, videos_dir, loss_type="grpo")
    assert trainer.model.device.type == torch.device(DEVICE).type
    batch = trainer.generate_and_score(trainer.data_collator([trainer.train_dataset[0]] * 4))
    for sign in (+1.0, -1.0):
        one = batching.select_rows(batch, [0])
        one["advantages"] = torch.tensor([sign], device=trainer.model.device)
        model = copy.deepcopy(trainer.model).train()
        before = _summed_logp(model, one)
        trainer.compute_loss(model, one).backward()
        with torch.no_grad():
            for p in model.parameters():
                if p.grad is not None:
                    p -= 1e-3 * p.grad
        assert (_summed_logp(model, one) - before) * sign > 1e-5, sign


@ON_CPU_ELSEWHERE
@pytest.mark.parametrize("share", [True, False])
def test_position_ids_match_in_generation_policy_and_reference(tmp_path, tiny_model_dir, videos_dir, share):
    trainer = _trainer(tmp_path, tiny_model_dir, videos_dir, beta=0.04, per_device_train_batch_size=8,
                       share_video_encoding=share, **PER_ROW_FORWARD)
    calls = {"policy": [], "ref": []}
    for name, model in (("policy", trainer.model), ("ref", trainer.ref_model)):
        model.model.language_model.register_forward_pre_hook(
            lambda m, args, kwargs, sink=calls[name]: sink.append(
                (torch.is_grad_enabled(), kwargs["position_ids"][-3:].clone())), with_kwargs=True)
    batch = trainer.generate_and_score(trainer.data_collator([trainer.train_dataset[i] for i in ROWS + [1, 1, 0]]))
    trainer.compute_loss(trainer.model.train(), batch)
    (policy,) = [pos for grad_on, pos in calls["policy"] if grad_on]
    (reference,) = [pos for _, pos in calls["ref"]]
    assert policy.device.type == torch.device(DEVICE).type
    assert torch.equal(policy, reference)
    prefill, *steps = [pos for grad_on, pos in calls["policy"] if not grad_on]
    if share:  # one prefill row per distinct clip (all but the last prompt token), then every row decodes
        prefill = prefill[:, batch["video_index"]]
    generated = torch.cat([prefill] + [pos.expand(3, prefill.shape[1], -1) for pos in steps], dim=2)
    length = generated.shape[2]
    valid = batching.forward_inputs(batch)["attention_mask"].bool()[:, :length]
    assert valid[:, -1].any()
    assert torch.equal(generated[:, valid], policy[:, :, :length][:, valid])


def _batches(model_dir, videos_dir, device, dtype):
    """(model, shared-video batch, per-row batch) with the same 6 random completion tokens per row, on ``device``."""
    processor = load_processor(str(model_dir))
    model = load_policy(str(model_dir), dtype=dtype).to(device)
    names = (POOL, MAKEUP)
    clips = {i: sample_frames(videos_dir / names[i], SETTINGS) for i in set(ROWS)}
    items = [{"index": i, "query": f"the main action in {names[i]}", "clip": clips[i]} for i in ROWS]
    generator = torch.Generator().manual_seed(0)
    completion = torch.randint(0, 151000, (len(ROWS), 6), generator=generator)
    out = []
    for share in (True, False):
        batch = batching.prompt_batch(processor, items, "default", share_videos=share)
        batch.update(completion_ids=completion, completion_mask=torch.ones_like(completion))
        out.append(batching.to_device(batch, device))
    return model, out[0], out[1]


def _loss_and_grads(model, batch):
    model.zero_grad(set_to_none=True)
    logps = completion_logps(model.train(), batch)
    loss = -(logps * torch.linspace(-1.0, 1.0, logps.shape[0], device=logps.device)[:, None]).mean()
    loss.backward()
    grads = {n: p.grad.detach().float().clone() for n, p in model.named_parameters() if p.grad is not None}
    return logps.detach().float(), loss.detach().float(), grads


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_encode_once_matches_per_row_encoding(tiny_model_dir, videos_dir, dtype):
    if dtype == "float32" and not os.environ.get("GROUNDING_RL_TEST_DEVICE"):
        pytest.skip("fp32 on CPU: tests/test_sharing.py")
    model, shared, per_row = _batches(tiny_model_dir, videos_dir, DEVICE, dtype)
    logps_on, loss_on, grads_on = _loss_and_grads(model, shared)
    logps_off, loss_off, grads_off = _loss_and_grads(model, per_row)
    assert grads_on.keys() == grads_off.keys() and any("visual" in n for n in grads_on)
    assert abs(loss_on.item()) > 1e-4
    if dtype == "float32":
        torch.testing.assert_close(logps_on, logps_off, rtol=1e-5, atol=1e-5)
        assert abs(loss_on.item() - loss_off.item()) <= 1e-5 * abs(loss_off.item())
        for name, g in grads_off.items():
            assert (grads_on[name] - g).norm() <= 1e-4 * g.norm() + 1e-12, name
    else:
        assert (logps_on - logps_off).abs().max().item() <= 0.05
        assert abs(loss_on.item() - loss_off.item()) <= 1e-2 * abs(loss_off.item())
        flat_on = torch.cat([grads_on[n].flatten() for n in sorted(grads_on)])
        flat_off = torch.cat([grads_off[n].flatten() for n in sorted(grads_off)])
        assert torch.nn.functional.cosine_similarity(flat_on, flat_off, dim=0).item() >= 0.99


@ON_CPU_ELSEWHERE
def test_reference_model_sees_the_video_and_starts_equal_to_the_policy(tmp_path, tiny_model_dir, videos_dir):
    trainer = _trainer(tmp_path, tiny_model_dir, videos_dir, beta=0.04)
    assert trainer.ref_model is not None and trainer.ref_model is not trainer.model
    assert next(trainer.ref_model.parameters()).device == next(trainer.model.parameters()).device
    assert not any(p.requires_grad for p in trainer.ref_model.parameters())
    calls = []
    vision_tower(trainer.ref_model).register_forward_hook(lambda m, args, out: calls.append(args[0].shape[0]))
    batch = trainer.generate_and_score(trainer.data_collator([trainer.train_dataset[0]] * 4))
    assert calls == [int(batch["video_grid_thw"][0].prod())]  # the clip's patches, once
    with torch.no_grad():
        policy = completion_logps(trainer.model.eval(), batch)
    mask = batch["completion_mask"].bool()
    torch.testing.assert_close(batch["ref_logps"][mask], policy[mask], rtol=1e-5, atol=1e-5)  # π_ref = π_θ at step 0
    assert _trainer(tmp_path, tiny_model_dir, videos_dir, beta=0.0).ref_model is None
