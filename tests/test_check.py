"""``grounding-rl check``: every check passes on the tiny models of both families, and each check names
the failure it exists for (the 24-fps fallback, the other Qwen3-VL layout, a prompt two tokens longer, a pair stamped
with one frame's time, a dtype mismatch); ``train``'s first-batch check draws no RNG and stops a mismatched run."""
import json

import pytest
import torch

from conftest import MAKEUP, POOL, clip_dataset, grpo_config, make_grpo_trainer
from grounding_rl.cli import main as cli
from grounding_rl.data.video import VideoSettings, sample_frames
from grounding_rl.family import family_of
from grounding_rl.models.loading import load_processor
from grounding_rl.update import check

SMALL = ["--use_cpu", "true", "--report_to", "none", "--video_fps", "1.0", "--video_min_pixels", "3136",
         "--video_max_pixels", str(32 * 32 * 16), "--num_generations", "2", "--max_completion_length", "6",
         "--per_device_train_batch_size", "2", "--beta", "0.04"]


def small_clip(processor, path, fps=1.0):
    settings = family_of(processor).video_settings(VideoSettings(fps=fps, min_pixels=3136, max_pixels=32 * 32 * 16))
    return sample_frames(str(path), settings)


def test_every_check_passes_on_both_families(family_model_dir, videos_dir, tmp_path, capsys):
    out = tmp_path / "check.json"
    rc = cli(["check", "--model_name_or_path", str(family_model_dir), "--video", str(videos_dir / MAKEUP), "--query",
              "someone", "--output_dir", str(tmp_path / "o"), "--json", str(out), *SMALL])
    table = capsys.readouterr().out
    assert rc == 0, table
    rows = json.loads(out.read_text())["checks"]
    names = {r["check"] for r in rows}
    time_check = "b.timestamps" if "qwen3" in family_model_dir.name else "b.second_per_grid_ts"
    assert {"a.prompt_ids", "b.frame_times", time_check, "c.positions", "d.logps hf/train", "d.logps ref/policy",
            "e.cost"} <= names
    by = {r["check"]: r for r in rows}
    assert by["a.prompt_ids"]["comparisons"] == 3  # 2 rollout rows + eval/infer against the loss batch
    assert by["c.positions"]["comparisons"] == 5  # + the shared-prefix rows
    assert by["d.logps hf/train"]["mean_abs"] < 1e-4 and by["d.logps hf/train"]["tokens"] == 12
    assert by["d.logps ref/policy"]["max_abs"] == 0.0  # bit-equal in float32 on CPU
    assert by["b.frame_times"]["max_dt_s"] < 1e-3
    assert by["e.cost"]["rollout_s"] > 0 and by["e.cost"]["rss_peak_gib"] > 0
    assert f"{len(rows)} of {len(rows)} checks passed" in table
    if "qwen3" in family_model_dir.name:
        return
    # thresholds of 0: the fp32 KV-cache decoding's 1e-7 gap fails d, exit 1, the first failing line on stderr
    rc = cli(["check", "--model_name_or_path", str(family_model_dir), "--video", str(videos_dir / MAKEUP), "--query",
              "someone", "--output_dir", str(tmp_path / "o"), *SMALL, "--check-threshold-mean", "0",
              "--check-threshold-token", "0", "--check-threshold-share", "0", "--max_completion_length", "3"])
    err = capsys.readouterr().err
    assert rc == 1 and "grounding-rl check: mismatch: FAIL d.logps hf/train" in err and "(limit 0)" in err


def test_model_folder_with_video_flags_runs_the_cheap_checks(tiny_model_dir, videos_dir, capsys):
    """``--model DIR`` (an eval/infer setup: no config), train's video names on top; ``--skip-rollout``: a, b, c."""
    rc = cli(["check", "--model", str(tiny_model_dir), "--video", str(videos_dir / MAKEUP), "--query", "someone",
              "--video_fps", "1", "--video_min_pixels", "3136", "--video_max_pixels", "12544", "--use_cpu", "true",
              "--skip-rollout"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "PASS b.second_per_grid_ts       mmaction2_eye_makeup.avi     second_per_grid_ts=2 expected=2" in out
    assert "rows=4 comparisons=5" in out and "d.logps" not in out and "5 of 5 checks passed" in out


def test_frames_without_metadata_are_the_24_fps_fallback(family_model_dir, videos_dir):
    processor = load_processor(str(family_model_dir))
    clip = small_clip(processor, videos_dir / POOL)
    family = family_of(processor)
    text = family.video_prompt(processor, "<|vision_start|><|video_pad|><|vision_end|>q")
    bare = processor(text=[text], videos=[clip.frames], **family.processor_kwargs(), return_tensors="pt")
    [result] = check.check_processed_frames(POOL, processor, clip, bare["input_ids"][0], bare)
    assert not result.passed and "24-fps fallback" in result.detail
    if "second_per_grid_ts" in bare:  # Qwen2.5-VL: 2 / 24; Qwen3-VL: <0.0 seconds> for the first pair, not 0.5
        assert result.numbers["second_per_grid_ts"] == pytest.approx(2 / 24, abs=1e-4)
    else:
        assert result.detail.startswith("group 0 is stamped <0.0 seconds>, its frames' mean time is 0.50 s")
    told = processor(text=[text], videos=[clip.frames], video_metadata=[family.video_metadata(clip)],
                     **family.processor_kwargs(), return_tensors="pt")
    assert check.check_processed_frames(POOL, processor, clip, told["input_ids"][0], told)[0].passed


def test_the_other_qwen3_layout_on_one_side_fails_ids_and_positions(tiny_qwen3_model_dir, videos_dir):
    from grounding_rl.models.loading import load_policy
    from grounding_rl.models.vision import rope_position_ids
    from grounding_rl.prompts.preprocessing import build_inputs

    processor = load_processor(str(tiny_qwen3_model_dir))
    model = load_policy(str(tiny_qwen3_model_dir))
    clip = small_clip(processor, videos_dir / MAKEUP)
    sides = [build_inputs(processor, ["q"], [clip], video_layout=layout) for layout in ("released", "transformers5")]
    ids = [check.rows(s["input_ids"], s["attention_mask"])[0] for s in sides]
    result = check.compare_ids("a.prompt_ids", MAKEUP, ids[1], ids[0], processor.tokenizer.decode)
    assert not result.passed and result.numbers["got_tokens"] == len(ids[0]) + 2
    positions = [check.valid_positions(rope_position_ids(model, s), s["attention_mask"])[0] for s in sides]
    moved = check.compare_positions("c.positions", MAKEUP, positions[1], positions[0])
    assert not moved.passed and "positioned tokens" in moved.detail


def test_a_prompt_two_tokens_longer_names_its_first_difference():
    want = [1, 2, 3, 4, 5]
    got = [1, 2, 9, 9, 3, 4, 5]  # vllm#46817: two tokens more
    result = check.compare_ids("a.prompt_ids vllm", "x.mp4", got, want)
    assert not result.passed
    assert result.numbers == {"tokens": 5, "got_tokens": 7, "first_diff": 2}
    assert "7 vs 5 tokens, first difference at position 2: [9, 9, 3] vs [3, 4, 5]" in result.detail


def test_a_pair_stamped_with_one_frames_time_is_named():
    times = [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    right = "".join(f"<{(times[i] + times[i + 1]) / 2:.1f} seconds>x" for i in range(0, 6, 2))
    assert check.check_timestamps("v.mp4", right, times).passed
    wrong = right.replace("<2.5 seconds>", "<2.0 seconds>")  # group 1 stamped with its first frame's time
    result = check.check_timestamps("v.mp4", wrong, times)
    assert not result.passed and result.detail.startswith("group 1 is stamped <2.0 seconds>")
    fallback = "".join(f"<{(2 * g + 0.5) / 24:.1f} seconds>" for g in range(3))  # indices 0..5 at 24 fps
    assert "24-fps fallback" in check.check_timestamps("v.mp4", fallback, times).detail


def test_a_dtype_mismatch_fails_the_float32_threshold(tiny_model_dir, videos_dir):
    from grounding_rl.models.loading import load_policy
    from grounding_rl.update import batching
    from grounding_rl.update.logprobs import completion_logps

    processor = load_processor(str(tiny_model_dir))
    model = load_policy(str(tiny_model_dir)).eval()
    items = [{"index": 0, "query": "q", "clip": small_clip(processor, videos_dir / MAKEUP)}] * 2
    batch = batching.prompt_batch(processor, items, "default")
    ids = torch.tensor([[11, 22, 33, 44], [55, 66, 77, 88]])
    batch.update(completion_ids=ids, completion_mask=torch.ones_like(ids))
    with torch.no_grad():
        fp32 = completion_logps(model, batch)
        bf16 = completion_logps(model.to(torch.bfloat16), batch).float()
    for engine in ("hf", "vllm"):  # the fp32 defaults of both engines fail it (vLLM's pass its ≈ 0.01 gap)
        limits = check.LOGP_THRESHOLDS[(engine, "float32")]
        result = check.compare_logps(f"d.logps {engine}/train", MAKEUP, bf16, fp32, batch["completion_mask"], limits)
        assert not result.passed and result.numbers["mean_abs"] > limits[0], result.line()
    assert check.compare_logps("d", MAKEUP, fp32, fp32, batch["completion_mask"], limits).passed


def test_train_first_batch_check_draws_no_rng_and_stops_a_mismatch(tiny_model_dir, videos_dir, tmp_path, capsys,
                                                                   monkeypatch):
    """Two 1-step GRPO runs, the first with the first-batch check before training: the same weights bit for bit."""
    from grounding_rl.cli.common import train_and_finish

    weights = []
    for with_check in (True, False):
        torch.manual_seed(0)
        trainer = make_grpo_trainer(tiny_model_dir, grpo_config(tmp_path / str(with_check), num_generations=2),
                                    clip_dataset(videos_dir))
        before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
        if with_check:
            results = check.first_batch_checks(trainer)
            assert results and all(r.passed for r in results), [r.line() for r in results if not r.passed]
        trainer.train()
        weights.append({k: v.clone() for k, v in trainer.model.state_dict().items()})
        assert any(not torch.equal(before[k], weights[-1][k]) for k in before)  # the step moved the weights
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])
    broken = check.Check("a.prompt_ids vllm", POOL, False, {}, "7 vs 5 tokens")
    monkeypatch.setattr(check, "first_batch_checks", lambda trainer: [broken])
    assert train_and_finish(trainer, None, "grounding-rl train") == 1
    assert "grounding-rl train: the first batch's check: FAIL a.prompt_ids vllm" in capsys.readouterr().err
