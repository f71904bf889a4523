"""One vision encoding and one prefill per clip: sharing on vs off on a tiny model of each family (Qwen2.5-VL;
Qwen3-VL with its DeepStack features and textual timestamps), real clips, fp32.

On vs off: the same sampled completions for the same seed, generation logits and 3D-RoPE-dependent scores within
fp32 rounding, loss within 1e-6 relative, every parameter's gradient within ‖Δg‖/‖g‖ ≤ 1e-5; and the vision tower
runs once per distinct clip in generation, the policy forward and the reference forward (separate reference model
and PEFT adapter-disabled), also when a process holds an uneven share of a clip's rows (a group split across ranks).
"""
import pytest
import torch

from conftest import MAKEUP, POOL, clip_dataset, grpo_config, make_grpo_trainer

from grounding_rl.data.video import VideoSettings, sample_frames
from grounding_rl.family import family_of
from grounding_rl.models.loading import load_policy, load_processor, vision_tower
from grounding_rl.models.vision import encode_videos, first_rows
from grounding_rl.rollout.shared import generate_shared
from grounding_rl.update import batching
from grounding_rl.update.logprobs import completion_logps

torch.set_num_threads(1)

SETTINGS = VideoSettings(fps=1.0, min_pixels=3136, max_pixels=28 * 28 * 16)
UNEVEN = [0, 1, 0, 0, 1]  # rows of two clips as one rank may hold them when groups are split across ranks


def _items(videos_dir, indices, processor):
    names = (POOL, MAKEUP)
    settings = family_of(processor).video_settings(SETTINGS)
    clips = {i: sample_frames(videos_dir / names[i], settings) for i in set(indices)}
    return [{"index": i, "query": f"the main action in {names[i]}", "clip": clips[i]} for i in indices]


class VisionCalls:
    """Forward hook on a vision tower: (grad enabled, number of patch rows) per call."""

    def __init__(self, model):
        self.calls = []
        vision_tower(model).register_forward_hook(
            lambda module, args, out: self.calls.append((torch.is_grad_enabled(), args[0].shape[0])))


def _patches(batch, rows):
    return int(batch["video_grid_thw"][rows].prod(dim=-1).sum())


# ------------------------------------------------------------------------------------------------------- batching
def test_select_and_split_keep_only_the_clips_their_rows_use():
    grid = torch.tensor([[1, 2, 2], [2, 2, 2], [1, 2, 4]])  # clips of 4, 8, 8 patches
    pixels = torch.arange(20).float().unsqueeze(1)
    index = torch.tensor([2, 0, 2, 1, 0, 0])
    batch = {"pixel_values_videos": pixels, "video_grid_thw": grid[index], "video_index": index,
             "prompt_ids": torch.arange(6).unsqueeze(1), "qid": list("abcdef"), "num_items_in_batch": torch.tensor(3)}
    assert first_rows(index) == [1, 3, 0]
    assert torch.equal(batching.clip_grid(batch), grid)

    picked = batching.select_rows(batch, [4, 2, 5])  # clips 0, 2, 0
    assert picked["video_index"].tolist() == [0, 1, 0]
    assert picked["pixel_values_videos"][:, 0].tolist() == [0, 1, 2, 3] + list(range(12, 20))
    assert picked["prompt_ids"].flatten().tolist() == [4, 2, 5] and picked["qid"] == ["e", "c", "f"]
    assert picked["num_items_in_batch"].item() == 3

    first, second = batching.split_rows(batch, 2)  # rows 0-2 use clips 2, 0; rows 3-5 use clips 1, 0
    assert first["video_index"].tolist() == [0, 1, 0] and second["video_index"].tolist() == [0, 1, 1]
    assert first["pixel_values_videos"][:, 0].tolist() == list(range(12, 20)) + [0, 1, 2, 3]
    assert second["pixel_values_videos"][:, 0].tolist() == list(range(4, 12)) + [0, 1, 2, 3]
    with pytest.raises(ValueError, match="without a row"):
        first_rows(torch.tensor([0, 2]))


def test_prompt_batch_shares_pixels(family_model_dir, videos_dir):
    processor = load_processor(str(family_model_dir))
    items = _items(videos_dir, UNEVEN, processor)
    shared = batching.prompt_batch(processor, items, "default", share_videos=True)
    per_row = batching.prompt_batch(processor, items, "default")
    assert shared["video_index"].tolist() == UNEVEN
    assert shared["pixel_values_videos"].shape[0] == _patches(shared, [0, 1])
    assert per_row["pixel_values_videos"].shape[0] == _patches(per_row, list(range(5)))
    for key in ("prompt_ids", "prompt_mask", "mm_token_type_ids") + family_of(processor).row_video_keys:
        assert torch.equal(shared[key], per_row[key]), key
    # the per-row patches are the distinct clips' patches, row by row
    offsets = [0, _patches(shared, [0]), _patches(shared, [0, 1])]
    expanded = torch.cat([shared["pixel_values_videos"][offsets[u]:offsets[u + 1]] for u in UNEVEN])
    assert torch.equal(expanded, per_row["pixel_values_videos"])


def test_build_inputs_preprocesses_each_distinct_clip_once(family_model_dir, videos_dir):
    """Several queries about a clip (evaluation): the video processor sees each distinct clip once, and every
    per-row input (token ids with Qwen3-VL's timestamps, grids, Qwen2.5-VL's second_per_grid_ts) equals the per-row
    processing."""
    from grounding_rl.prompts.preprocessing import build_inputs

    processor = load_processor(str(family_model_dir))
    clips = [item["clip"] for item in _items(videos_dir, UNEVEN, processor)]
    queries = ["one", "two two", "three", "four", "five five five"]
    seen = []
    original = type(processor.video_processor).__call__
    type(processor.video_processor).__call__ = lambda self, videos, **kw: seen.append(len(videos)) or original(
        self, videos, **kw)
    try:
        shared = build_inputs(processor, queries, clips, "default", share_videos=True)
        per_row = build_inputs(processor, queries, clips, "default")
    finally:
        type(processor.video_processor).__call__ = original
    assert seen == [2, 5]
    assert shared["video_index"].tolist() == UNEVEN
    assert sorted(shared) == sorted(per_row) + ["video_index"]
    for key in per_row:
        if key != "pixel_values_videos":
            assert torch.equal(shared[key], per_row[key]), key
    # rows 0 and 1 are the first uses of clips 0 and 1: the shared patches are theirs, in that order
    assert torch.equal(shared["pixel_values_videos"], per_row["pixel_values_videos"][:_patches(per_row, [0, 1])])


# ------------------------------------------------------------------------------------------------------ generation
def test_generation_is_identical_and_encodes_each_clip_once(family_model_dir, videos_dir):
    processor = load_processor(str(family_model_dir))
    model = load_policy(str(family_model_dir)).eval()
    calls = VisionCalls(model)
    items = _items(videos_dir, UNEVEN, processor)
    shared = batching.generation_inputs(batching.prompt_batch(processor, items, "default", share_videos=True))
    per_row = batching.generation_inputs(batching.prompt_batch(processor, items, "default"))
    gen = dict(do_sample=True, max_new_tokens=6, top_k=None, top_p=1.0, min_p=None, output_logits=True,
               return_dict_in_generate=True)

    torch.manual_seed(3)
    with torch.no_grad():
        reference = model.generate(**per_row, **gen)
    assert calls.calls == [(False, _patches(per_row, list(range(5))))]  # every row re-encoded
    calls.calls.clear()
    torch.manual_seed(3)
    video_index = shared.pop("video_index")
    out, width = generate_shared(model, shared, video_index, **gen)
    assert width == per_row["input_ids"].shape[1]  # a GRPO group keeps its left-padded layout
    assert calls.calls == [(False, _patches(per_row, [0, 1]))]  # each distinct clip once

    if "second_per_grid_ts" in per_row:
        # the pool clip's temporal RoPE ids run past the text after it (Qwen2.5-VL): the case where a prefill's
        # stored rope_deltas would misplace the continuation (shared._continuation_deltas)
        positions, deltas = model.model.get_rope_index(
            per_row["input_ids"], mm_token_type_ids=per_row["mm_token_type_ids"],
            video_grid_thw=per_row["video_grid_thw"], second_per_grid_ts=per_row["second_per_grid_ts"],
            attention_mask=per_row["attention_mask"])
        assert positions[:, 0].max() > positions[0, 0, -1]

    assert torch.equal(out.sequences, reference.sequences)
    assert len(out.logits) == len(reference.logits) == 6
    for step, (a, b) in enumerate(zip(out.logits, reference.logits)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5, msg=f"decoding step {step}")
    # 2 distinct clips → distinct logits for their rows; rows of one clip have the same first-step logits
    first = out.logits[0]
    torch.testing.assert_close(first[0], first[2], rtol=1e-5, atol=1e-5)
    assert (first[0] - first[1]).abs().max() > 1e-3


# ------------------------------------------------------------------------------------------------------ trainer
def _trainer(tmp_path, tiny_model_dir, videos_dir, share, peft=False, **overrides):
    attention = overrides.pop("attn_implementation", None)
    config = grpo_config(tmp_path / f"out{share}{peft}", **{"per_device_train_batch_size": 8,
                                                            "max_completion_length": 6, "beta": 0.04,
                                                            "share_video_encoding": share, **overrides})
    lora = None
    if peft:
        from peft import LoraConfig

        # the same random adapter (init_lora_weights=False) in both arms
        lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "qkv"], init_lora_weights=False)
    return make_grpo_trainer(tiny_model_dir, config, clip_dataset(videos_dir, (POOL, MAKEUP)), peft=lora,
                             attn_implementation=attention)


def _step(trainer, items):
    """Rollout (generation, π_ref) then one loss forward/backward; returns batch, loss and per-parameter grads."""
    torch.manual_seed(11)
    batch = trainer.generate_and_score(items)
    batch["sampled_ref_logps"] = batch["ref_logps"]
    # at the first step π_θ = π_old = π_ref and the surrogate sums the zero-mean advantages: the loss would be ~0;
    # a fixed offset of π_ref (the same for both arms) gives the KL term a value that could be wrong
    batch = {**batch, "ref_logps": batch["ref_logps"] + torch.linspace(-0.5, 0.5, batch["ref_logps"].shape[1])}
    model = trainer.model.train()
    model.zero_grad()
    loss = trainer.compute_loss(model, batch)
    loss.backward()
    grads = {name: p.grad.detach().clone() for name, p in model.named_parameters() if p.grad is not None}
    return batch, loss.detach(), grads


def _assert_equivalent(on, off):
    (batch_on, loss_on, grads_on), (batch_off, loss_off, grads_off) = on, off
    assert torch.equal(batch_on["completion_ids"], batch_off["completion_ids"])  # same samples, same seed
    assert torch.equal(batch_on["advantages"], batch_off["advantages"])
    torch.testing.assert_close(batch_on["sampled_ref_logps"], batch_off["sampled_ref_logps"], rtol=1e-5, atol=1e-5)
    assert abs(loss_on.item()) > 1e-4  # a loss that could be wrong
    # float32 sums in another order: 1.5e-6 apart with AVX-512 kernels (Intel Xeon, 2026-12-06), within 1e-6 with AVX2
    assert abs(loss_on.item() - loss_off.item()) <= 1e-5 * abs(loss_off.item())
    assert grads_on.keys() == grads_off.keys() and any("visual" in name for name in grads_on)
    for name, g_off in grads_off.items():
        norm = g_off.norm().item()
        diff = (grads_on[name] - g_off).norm().item()
        assert diff <= 1e-5 * norm or (norm == 0 and diff == 0), (name, diff, norm)


def test_loss_gradients_and_samples_match_with_reference_model(tmp_path, family_model_dir, videos_dir):
    """β > 0 with a separate reference model; an uneven row split (as on one rank of a multi-process run)."""
    results, counts = {}, {}
    for share in (True, False):
        trainer = _trainer(tmp_path, family_model_dir, videos_dir, share)
        assert trainer.ref_model is not None
        policy_calls, ref_calls = VisionCalls(trainer.model), VisionCalls(trainer.ref_model)
        items = trainer.data_collator([trainer.train_dataset[i] for i in UNEVEN + [1, 1, 0]])
        results[share] = _step(trainer, items)
        counts[share] = (policy_calls.calls, ref_calls.calls)
    _assert_equivalent(results[True], results[False])

    batch = results[False][0]
    distinct, every_row = _patches(batch, [0, 1]), _patches(batch, list(range(8)))
    # on: generation (no grad) and the loss forward (grad) on the policy, π_ref on the reference — each once per clip
    assert counts[True] == ([(False, distinct), (True, distinct)], [(False, distinct)])
    assert counts[False] == ([(False, every_row), (True, every_row)], [(False, every_row)])


def test_peft_reference_with_adapter_disabled_encodes_once(tmp_path, family_model_dir, videos_dir):
    results, counts = {}, {}
    for share in (True, False):
        trainer = _trainer(tmp_path, family_model_dir, videos_dir, share, peft=True)
        assert trainer.ref_model is None
        calls = VisionCalls(trainer.model)
        items = trainer.data_collator([trainer.train_dataset[i] for i in (0, 0, 0, 0, 1, 1, 1, 1)])
        results[share] = _step(trainer, items)
        counts[share] = list(calls.calls)
        with torch.no_grad():
            policy_logps = completion_logps(trainer.model, results[share][0])
        # the adapter (non-zero: init_lora_weights=False) was really disabled for π_ref
        assert (policy_logps - results[share][0]["sampled_ref_logps"]).abs().max() > 1e-4
    _assert_equivalent(results[True], results[False])
    batch = results[True][0]
    distinct = _patches(batch, [0, 4])
    # generation, π_ref (adapter disabled), loss forward: each distinct clip once
    assert counts[True] == [(False, distinct), (False, distinct), (True, distinct)]
    assert counts[False] == [(False, 4 * distinct), (False, 4 * distinct), (True, 4 * distinct)]


def test_encode_videos_matches_per_row_features(family_model_dir, videos_dir):
    processor = load_processor(str(family_model_dir))
    model = load_policy(str(family_model_dir)).eval()
    items = _items(videos_dir, UNEVEN, processor)
    shared = batching.prompt_batch(processor, items, "default", share_videos=True)
    per_row = batching.prompt_batch(processor, items, "default")
    with torch.no_grad():
        encoded = encode_videos(model, shared["pixel_values_videos"], batching.clip_grid(shared),
                                shared["video_index"])["video"]
        reference = model.get_video_features(per_row["pixel_values_videos"], per_row["video_grid_thw"])
    assert len(encoded.pooler_output) == len(reference.pooler_output) == 5
    for a, b in zip(encoded.pooler_output, reference.pooler_output):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    deepstack = getattr(reference, "deepstack_features", None)
    if deepstack is not None:  # Qwen3-VL: every DeepStack layer's features, row by row
        assert len(deepstack) == len(model.config.vision_config.deepstack_visual_indexes) == 3
        assert len(encoded.deepstack_features) == 3
        for layer_shared, layer_ref in zip(encoded.deepstack_features, deepstack):
            assert len(layer_shared) == len(layer_ref) == 5
            for a, b in zip(layer_shared, layer_ref):
                torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("fps", [1.0, 4.0])
def test_position_ids_match_in_shared_generation_policy_and_reference(tmp_path, family_model_dir, videos_dir, fps):
    """3D RoPE ids with sharing on: the shared prefill (one row per distinct clip, each clip's prompt but its last
    token, clip by clip) followed by the continued decoding give every row the ids the policy and reference forwards use."""
    trainer = _trainer(tmp_path, family_model_dir, videos_dir, True, video_fps=fps, share_prompt_prefix=False)
    policy_calls, ref_calls = [], []
    for model, sink in ((trainer.model, policy_calls), (trainer.ref_model, ref_calls)):
        model.model.language_model.register_forward_pre_hook(
            lambda m, args, kwargs, sink=sink: sink.append((torch.is_grad_enabled(), kwargs["position_ids"].clone())),
            with_kwargs=True)
    items = trainer.data_collator([trainer.train_dataset[i] for i in UNEVEN + [1, 1, 0]])
    batch = trainer.generate_and_score(items)
    trainer.compute_loss(trainer.model.train(), batch)

    (policy,) = [pos[-3:] for grad_on, pos in policy_calls if grad_on]
    (reference,) = [pos[-3:] for _, pos in ref_calls]
    assert torch.equal(policy, reference)
    no_grad = [pos for grad_on, pos in policy_calls if not grad_on]
    prefills, steps = no_grad[:2], no_grad[2:]
    rows = batch["video_index"]
    width = batch["prompt_ids"].shape[1] - 1
    # one forward of one row per clip, as wide as that clip's prompt; the longer clip's spans all columns but the last
    assert [p.shape[1] for p in prefills] == [1, 1] and max(p.shape[2] for p in prefills) == width
    prefill = torch.zeros(3, 2, width, dtype=prefills[0].dtype)
    for clip, positions in enumerate(prefills):
        prefill[:, clip, width - positions.shape[2]:] = positions[-3:, 0]
    generated = torch.cat([prefill[:, rows]] + [pos[-3:].expand(3, -1, -1) for pos in steps], dim=2)
    length = generated.shape[2]
    assert length == batch["prompt_ids"].shape[1] + batch["completion_ids"].shape[1] - 1
    valid = batching.forward_inputs(batch)["attention_mask"].bool()[:, :length]
    assert torch.equal(generated[:, valid], policy[:, :, :length][:, valid])
    if "second_per_grid_ts" in batch:
        # Qwen2.5-VL: the temporal ids of the pool clip run past the text after it (the case rope_deltas alone would
        # get wrong)
        pool = rows.tolist().index(0)
        assert policy[0, pool].max() > policy[0, pool, batch["prompt_ids"].shape[1] - 1]


# ------------------------------------------------------------------------------------------------------ prefix
def _uneven(batch):
    """Completions of uneven length: row r keeps its first C − (r mod 4) tokens (the rest masked, as after EOS)."""
    mask = batch["completion_mask"].clone()
    for row in range(mask.shape[0]):
        cut = row % 4
        if cut:
            mask[row, -cut:] = 0
    return {**batch, "completion_mask": mask}


@pytest.mark.parametrize("fps, attention", [(1.0, "sdpa"), (4.0, "eager")])
def test_prefix_sharing_gives_the_per_row_logps_and_positions(tmp_path, family_model_dir, videos_dir, fps,
                                                              attention):
    """One packed row per group: each completion's 3-D position ids and log-probs are the per-row ones; the language
    model runs each prompt once (2 packed rows for 8 rows of 2 clips); with sdpa (boolean mask) and eager (additive)."""
    from grounding_rl.update.prefix import group_rows

    trainer = _trainer(tmp_path, family_model_dir, videos_dir, True, video_fps=fps, attn_implementation=attention)
    assert trainer.share_prompt
    items = trainer.data_collator([trainer.train_dataset[i] for i in UNEVEN + [1, 1, 0]])
    batch = _uneven(trainer.generate_and_score(items))
    seen = []
    trainer.model.model.language_model.register_forward_pre_hook(
        lambda m, args, kwargs: seen.append(kwargs["position_ids"].clone()), with_kwargs=True)
    with torch.no_grad():
        per_row = completion_logps(trainer.model, batch, share_prompt=False)
        packed = completion_logps(trainer.model, batch, share_prompt=True)
    row_positions, packed_positions = seen
    assert row_positions.shape[1] == 8 and packed_positions.shape[1] == 2  # the prompt runs once per clip
    mask = batch["completion_mask"].bool()
    torch.testing.assert_close(packed[mask], per_row[mask], rtol=1e-5, atol=1e-5)
    assert (per_row[mask] - per_row[mask].mean()).abs().max() > 1e-3  # values that could be wrong
    prompt, length = batch["prompt_ids"].shape[1], batch["completion_ids"].shape[1]
    for u, rows in enumerate(group_rows(batch["video_index"])):
        valid = batch["prompt_mask"][rows[0]].bool()
        assert torch.equal(packed_positions[:, u, :prompt][:, valid], row_positions[:, rows[0], :prompt][:, valid])
        for g, row in enumerate(rows):
            start = prompt + g * length
            assert torch.equal(packed_positions[:, u, start:start + length], row_positions[:, row, prompt:])


def test_prefix_sharing_matches_per_row_with_checkpointing_and_two_iterations(tmp_path, family_model_dir,
                                                                             videos_dir):
    """β > 0, activation checkpointing, num_iterations 2 (stored π_old log-probs) and uneven completion lengths: loss
    within 1e-6 and gradients within 1e-5 relative of the per-row path."""
    results = {}
    for prefix in (True, False):
        trainer = _trainer(tmp_path, family_model_dir, videos_dir, True, share_prompt_prefix=prefix,
                           activation_checkpointing=True, num_iterations=2)
        assert trainer.share_prompt is prefix
        items = trainer.data_collator([trainer.train_dataset[i] for i in UNEVEN + [1, 1, 0]])
        torch.manual_seed(11)
        batch = _uneven(trainer.generate_and_score(items))
        assert "old_logps" in batch
        batch["sampled_ref_logps"] = batch["ref_logps"]
        batch = {**batch, "ref_logps": batch["ref_logps"] + torch.linspace(-0.5, 0.5, batch["ref_logps"].shape[1]),
                 "old_logps": batch["old_logps"] - 0.05}
        model = trainer.model.train()
        model.zero_grad()
        loss = trainer.compute_loss(model, batch)
        loss.backward()
        results[prefix] = (batch, loss.detach(),
                           {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None})
    _assert_equivalent(results[True], results[False])
    mask = results[True][0]["completion_mask"].bool()
    torch.testing.assert_close(results[True][0]["old_logps"][mask], results[False][0]["old_logps"][mask],
                               rtol=1e-5, atol=1e-5)


def test_prefix_sharing_falls_back_with_one_warning(tmp_path, tiny_model_dir, videos_dir, caplog):
    trainer = _trainer(tmp_path, tiny_model_dir, videos_dir, False)
    assert not trainer.share_prompt and "share_video_encoding is off" in caplog.text
    from grounding_rl.update.prefix import supports_prefix_sharing

    trainer.model.config._attn_implementation = "flash_attention_2"
    assert supports_prefix_sharing(trainer.model) == (False, "attention implementation 'flash_attention_2' takes "
                                                             "no 4-D mask (supported: ('sdpa', 'eager'))")


def test_text_first_queries_are_prefilled_clip_by_clip(family_model_dir, videos_dir, monkeypatch):
    """Different queries before the video (ours, TimeZero's order) on two clips of different lengths: each clip is
    encoded once and its rows are prefilled in a forward of their own, only as wide as its longest row; the stacked
    caches decode the same tokens with the same logits as ``generate`` on the left-padded per-row batch."""
    from grounding_rl.prompts.preprocessing import MODEL_INPUT_KEYS, build_inputs

    processor = load_processor(str(family_model_dir))
    model = load_policy(str(family_model_dir)).eval()
    items = _items(videos_dir, UNEVEN, processor)
    queries = ["a person cleans the pool.", "eye makeup is applied", "the net goes in",
               "someone walks away from the water.", "the brush stops"]
    clips = [item["clip"] for item in items]
    shared = dict(build_inputs(processor, queries, clips, "default", share_videos=True))
    per_row = {k: v for k, v in build_inputs(processor, queries, clips, "default").items() if k in MODEL_INPUT_KEYS}
    gen = dict(do_sample=True, max_new_tokens=6, top_k=None, top_p=1.0, min_p=None, output_logits=True,
               return_dict_in_generate=True)
    torch.manual_seed(5)
    with torch.no_grad():
        reference = model.generate(**per_row, **gen)

    forwards = []
    model.model.language_model.register_forward_pre_hook(
        lambda m, args, kwargs: forwards.append(tuple(kwargs["inputs_embeds"].shape[:2])), with_kwargs=True)
    calls = VisionCalls(model)
    torch.manual_seed(5)
    video_index = shared.pop("video_index")
    out, width = generate_shared(model, shared, video_index, **gen)
    lengths = per_row["attention_mask"].sum(dim=-1)
    clip_width = [int(lengths[video_index == u].max()) - 1 for u in (0, 1)]
    assert forwards[:2] == [(3, clip_width[0]), (2, clip_width[1])]  # one prefill per clip, its own width
    assert min(clip_width) < per_row["input_ids"].shape[1] - 1  # the shorter clip is not padded to the longer
    assert calls.calls == [(False, _patches(per_row, [0, 1]))]  # each distinct clip encoded once
    assert width == per_row["input_ids"].shape[1]
    assert torch.equal(out.sequences, reference.sequences)
    for step, (a, b) in enumerate(zip(out.logits, reference.logits)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5, msg=f"decoding step {step}")
    assert (out.logits[0][0] - out.logits[0][2]).abs().max() > 1e-4  # different queries, different answers

    # ZeRO-3 with partitioned parameters: one forward for all rows (every rank runs as many as the others)
    from grounding_rl.rollout import shared as shared_module

    monkeypatch.setattr(shared_module, "_partitioned", lambda model: True)
    forwards.clear()
    torch.manual_seed(5)
    together, _ = generate_shared(model, shared, video_index, **gen)
    assert forwards[0] == (5, per_row["input_ids"].shape[1] - 1)
    assert torch.equal(together.sequences, reference.sequences)


def test_video_first_queries_on_one_clip_share_one_prefill(noisy_tiny_model_dir, videos_dir):
    """Several queries about one clip with a video-first prompt (TimeLens's): the system text, the video and the
    shared start of the instruction are prefilled once (one row) and every query continues from that KV cache; the
    greedy answers equal those of each query alone. With the query before the video (ours), the clip is still encoded
    once."""
    from grounding_rl.prompts.preprocessing import build_inputs
    from grounding_rl.rollout.generation import SamplingParams, generate_answers
    from grounding_rl.rollout.shared import shared_prefix_layout

    processor = load_processor(str(noisy_tiny_model_dir))
    model = load_policy(str(noisy_tiny_model_dir)).eval()
    clip = sample_frames(videos_dir / POOL, SETTINGS)
    queries = ["a person cleans the pool.", "the net goes in", "someone walks away from the water."]
    prefill_rows = []
    model.model.language_model.register_forward_pre_hook(
        lambda m, args, kwargs: prefill_rows.append(tuple(kwargs["inputs_embeds"].shape[:2])), with_kwargs=True)
    calls = VisionCalls(model)
    for template, video_first in (("timelens", True), ("default", False)):
        inputs = build_inputs(processor, queries, [clip] * 3, template, share_videos=True)
        layout = shared_prefix_layout(dict(inputs), inputs["video_index"])
        assert (layout is not None) is video_first
        prefill_rows.clear()
        calls.calls.clear()
        together = generate_answers(model, processor, queries, [clip] * 3, template, SamplingParams.greedy(8))
        assert len(calls.calls) == 1  # one encoding for the three queries
        if video_first:
            assert prefill_rows[0][0] == 1 and prefill_rows[0][1] == layout[2]  # the shared prefix, once
            assert layout[2] > int(inputs["mm_token_type_ids"][0].ne(0).sum())  # it holds the video tokens
        alone = [generate_answers(model, processor, [q], [clip], template, SamplingParams.greedy(8))[0]
                 for q in queries]
        assert together == alone
        assert len(set(together)) > 1
