"""SFT cold start for the crop tool: crop trajectories as targets (the window rule, the seeded choice, the
conversation's text and label mask) and one tiny-model step on a trajectory."""
import json

import pytest
import torch

from grounding_rl.data.dataset import GroundingDataset
from grounding_rl.data.video import VideoSettings
from grounding_rl.prompts.templates import answer_text
from grounding_rl.rollout import conversation as conv
from grounding_rl.rollout import tools
from grounding_rl.update.sft import (IGNORE_INDEX, MAX_CROP_MARGIN, GroundingSFTConfig, SFTCollator, crop_plan,
                                     crop_target_window)

torch.set_num_threads(1)
DEMO_VIDEO = dict(fps=2.0, min_pixels=3136, max_pixels=3136)
THINK = "look"


# ------------------------------------------------------------------------------------------------ pure, no model
def test_crop_target_window_values():
    # m = max(u · (e − s), 2 / f₁) per side: 2 / 0.32 = 6.25 s floor
    # whole seconds, outwards: start rounded down, end up
    assert crop_target_window(40, 45, 150, 0.32, (0.5, 2.0)) == (33.0, 55.0)  # left floor 33.75, right 2 × 5 s
    assert crop_target_window(40, 45, 150, 0.32, (0.0, 0.0)) == (33.0, 52.0)  # both at the floor: 33.75, 51.25
    assert crop_target_window(2, 5, 30, 1.0, (1.0, 1.0)) == (0.0, 8.0)  # clipped at 0: 2 − 3
    assert crop_target_window(20, 28, 30, 1.0, (1.5, 0.1)) == (8.0, 30.0)  # 12 s to the left; clipped at 30
    assert crop_target_window(140, 145, 150.5, 0.32, (1.0, 1.0)) == (133.0, 150.5)  # the video's end, not 152
    assert crop_target_window(1.234, 2.5, 30, 1.0, (0.0, 0.0)) == (0.0, 5.0)  # 4.5 up


def test_crop_plan_is_seeded_per_sample():
    assert crop_plan(0, 7, 1.0) == crop_plan(0, 7, 1.0)  # a pure function of (seed, index)
    assert crop_plan(0, 7, 1.0) != crop_plan(1, 7, 1.0) and crop_plan(0, 7, 1.0) != crop_plan(0, 8, 1.0)
    assert all(crop_plan(0, i, 0.0) is None for i in range(100))
    plans = [crop_plan(0, i, 1.0) for i in range(1000)]
    assert all(0.0 <= u < MAX_CROP_MARGIN for p in plans for u in p)
    share = sum(crop_plan(0, i, 0.5) is not None for i in range(1000)) / 1000
    assert 0.45 < share < 0.55
    # the margins do not depend on the fraction: a trajectory keeps its window when the fraction grows
    assert all(crop_plan(0, i, 0.5) in (None, plans[i]) for i in range(1000))


def test_call_text_is_what_the_parser_reads():
    text = tools.call_text((4.0, 9.5))
    assert text == '<tool_call>{"name": "crop", "arguments": {"start": 4, "end": 9.5}}</tool_call>'
    assert tools.parse_tool_call(text, 30.0) == tools.ToolRequest("call", (4.0, 9.5))
    assert tools.parse_tool_call(tools.call_text((1.234, 5.678)), 30.0).window == (1.23, 5.68)


def test_crop_settings_are_checked(tmp_path):
    def config(**kw):
        return GroundingSFTConfig(output_dir=str(tmp_path), **kw)

    assert config(crop_trajectory_fraction=0.5, max_tool_calling_iterations=2).crop_trajectory_fraction == 0.5
    with pytest.raises(ValueError, match=r"crop_trajectory_fraction must be in \[0, 1\] \(got 1.5\)"):
        config(crop_trajectory_fraction=1.5, max_tool_calling_iterations=1)
    with pytest.raises(ValueError, match="needs max_tool_calling_iterations ≥ 1"):
        config(crop_trajectory_fraction=0.5)
    with pytest.raises(ValueError, match="max_tool_calling_iterations 2 is only used with crop_trajectory_fraction"):
        config(max_tool_calling_iterations=2)
    with pytest.raises(ValueError, match="exact sampler"):
        config(crop_trajectory_fraction=0.5, max_tool_calling_iterations=1, video_sampler="qwen_vl_utils")
    with pytest.raises(ValueError, match="set of intervals"):
        config(crop_trajectory_fraction=0.5, max_tool_calling_iterations=1, prompt_template="timelens2")


# ------------------------------------------------------------------------------- the target conversation, no model
@pytest.fixture(scope="module")
def demo_processor(bpe_tiny_model_dir):
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(bpe_tiny_model_dir)


def hand_made(demo_dir):
    """Two hand-made samples on the first demo clip: gt 2-4 s and 6-8.5 s."""
    from grounding_rl.data.samples import load_samples

    first = load_samples(demo_dir / "train.jsonl")[0].to_dict()
    rows = [{**first, "start": 2.0, "end": 4.0, "query": "the red square appears.", "qid": "a"},
            {**first, "start": 6.0, "end": 8.5, "query": "the blue circle is visible.", "qid": "b"}]
    dataset = GroundingDataset(rows)
    return dataset, [dataset[i] for i in range(len(dataset))]


def test_a_trajectory_target_is_the_rollouts_conversation_trained_on_model_turns_only(demo_dir, demo_processor):
    """Every row a trajectory (fraction 1, K = 2): the ids are exactly what the multi-turn rollout builds from the
    same two model turns; labels cover the crop request and the answer (each with <|im_end|>), nothing of the tool
    turn, the prompt or the videos."""
    from grounding_rl.family import family_of

    tok = demo_processor.tokenizer
    dataset, rows = hand_made(demo_dir)
    settings = VideoSettings(**DEMO_VIDEO)
    collator = SFTCollator(demo_processor, dataset, "default", settings, THINK, crop_fraction=1.0, max_turns=2,
                           seed=0)
    batch = collator(rows)
    family = family_of(demo_processor)
    clips = collator.loader(rows)
    assert batch["video_grid_thw"].shape[0] == 4  # the clip, then the window, per row
    offset = 0
    for i, row in enumerate(clips):
        clip = row["clip"]
        window = crop_target_window(row["start"], row["end"], clip.duration, clip.sampled_fps,
                                    crop_plan(0, i, 1.0))
        assert window[0] <= row["start"] < row["end"] <= window[1]
        call, answer = tools.call_text(window), answer_text(row["start"], row["end"], THINK)
        # the rollout's own loop with the two turns scripted
        t = conv.start(demo_processor, family, row["query"], clip, "default", 2)
        scripted = iter([tok(x + "<|im_end|>", add_special_tokens=False)["input_ids"] for x in (call, answer)])
        conv.run_conversations(lambda active: [next(scripted)], [t], demo_processor, family,
                               tools.CropEnvironment(family.video_settings(settings)), 2,
                               end_ids=[tok.convert_tokens_to_ids("<|im_end|>")])
        assert [turn["kind"] for turn in t.turns] == ["call", "answer"] and t.windows == [window]
        mask = batch["attention_mask"][i].bool()
        ids, labels = batch["input_ids"][i][mask], batch["labels"][i][mask]
        assert ids.tolist() == t.prompt_ids + t.completion_ids
        assert batch["mm_token_type_ids"][i][mask].tolist() == t.prompt_mm + t.completion_mm
        assert (batch["labels"][i][~mask] == IGNORE_INDEX).all()
        # trained: the two model turns, in order, each ending with <|im_end|>; their counts
        trained = labels[labels != IGNORE_INDEX]
        assert tok.decode(trained) == call + "<|im_end|>" + answer + "<|im_end|>"
        n_model = len(tok(call + "<|im_end|>", add_special_tokens=False)["input_ids"]) + \
            len(tok(answer + "<|im_end|>", add_special_tokens=False)["input_ids"])
        assert len(trained) == n_model == sum(t.tool_mask)
        n_prompt = len(t.prompt_ids)
        assert (labels[:n_prompt] == IGNORE_INDEX).all()
        tool = [j for j, m in enumerate(t.tool_mask) if not m]  # the tool turn: its text and the window's video
        assert len(tool) == len(t.completion_ids) - n_model > 0
        assert (labels[n_prompt:][tool] == IGNORE_INDEX).all()
        assert (batch["mm_token_type_ids"][i][mask][n_prompt:][tool] == 2).sum() > 0  # the window's video tokens
        tool_text = tok.decode(ids[n_prompt:][tool])
        assert f"Frames {window[0]:.2f}-{window[1]:.2f} s of the video (" in tool_text
        assert "crop" not in tool_text and "<answer>" not in tool_text
        prompt_text = tok.decode(t.prompt_ids)
        assert tools.offer_text(tools.TEXT, 2) in prompt_text  # the tool offered, K = 2
        # the videos: this row's clip then its window, as the rollout processed them
        for video in t.videos:
            assert torch.equal(batch["video_grid_thw"][offset], video["video_grid_thw"])
            offset += 1
    pixels = torch.cat([v["pixel_values_videos"] for v in t.videos])
    assert torch.equal(batch["pixel_values_videos"][-len(pixels):], pixels)


def test_direct_rows_of_a_mixed_batch_are_the_single_turn_samples(demo_dir, demo_processor):
    """fraction 0.5: the rows crop_plan leaves direct are token for token the single-turn SFT rows (no tool offered)
    with the same videos; the trajectory rows offer the tool."""
    from grounding_rl.data.samples import load_samples

    dataset = GroundingDataset(load_samples(demo_dir / "train.jsonl")[:8])
    rows = [dataset[i] for i in range(8)]
    settings = VideoSettings(**DEMO_VIDEO)
    kinds = [crop_plan(3, i, 0.5) is not None for i in range(8)]
    assert 0 < sum(kinds) < 8  # seed 3 mixes both kinds in these 8 rows
    mixed = SFTCollator(demo_processor, dataset, "default", settings, THINK, crop_fraction=0.5, max_turns=1,
                        seed=3)(rows)
    single = SFTCollator(demo_processor, dataset, "default", settings, THINK)(rows)
    tok = demo_processor.tokenizer
    grids = []
    for i, crops in enumerate(kinds):
        ids = mixed["input_ids"][i][mixed["attention_mask"][i].bool()]
        text = tok.decode(ids)
        if crops:
            assert "<tool_call>" in text and "No more crops: answer now. Frames" in text  # K = 1: the final note
        else:
            assert ids.tolist() == single["input_ids"][i][single["attention_mask"][i].bool()].tolist()
            labels = mixed["labels"][i][mixed["attention_mask"][i].bool()]
            assert labels.tolist() == single["labels"][i][single["attention_mask"][i].bool()].tolist()
            assert "<tool_call>" not in text
        grids.append(2 if crops else 1)
    assert mixed["video_grid_thw"].shape[0] == sum(grids)
    assert mixed["second_per_grid_ts"].shape == (sum(grids),)
    assert mixed["pixel_values_videos"].shape[0] == int(mixed["video_grid_thw"].prod(dim=1).sum())


# --------------------------------------------------------------------------------------------- one tiny-model step
def test_one_sft_step_on_a_trajectory_trains_the_model_turns_only(demo_dir, bpe_tiny_model_dir, tmp_path):
    """A forward of the tiny model on a trajectory batch: the loss is the mean over the model turns' tokens only
    (recomputed from the logits with the tool turn's tokens excluded), finite; then one step of grounding-rl sft."""
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from grounding_rl.cli.sft import main

    processor = AutoProcessor.from_pretrained(bpe_tiny_model_dir)
    model = AutoModelForImageTextToText.from_pretrained(bpe_tiny_model_dir).eval()
    dataset, rows = hand_made(demo_dir)
    collator = SFTCollator(processor, dataset, "default", VideoSettings(**DEMO_VIDEO), THINK, crop_fraction=1.0,
                           max_turns=2, seed=0)
    batch = collator(rows[:1])
    labels = batch["labels"][0]
    tok = processor.tokenizer
    clip = collator.loader(rows[:1])[0]["clip"]
    call = tools.call_text(crop_target_window(2.0, 4.0, clip.duration, clip.sampled_fps, crop_plan(0, 0, 1.0)))
    n_model = len(tok(call + "<|im_end|>" + answer_text(2.0, 4.0, THINK) + "<|im_end|>",
                      add_special_tokens=False)["input_ids"])
    assert int((labels != IGNORE_INDEX).sum()) == n_model
    # the tool turn, from its <|im_start|>user to the answer turn's <|im_start|>: text and the window's video, no label
    starts = (batch["input_ids"][0] == tok.convert_tokens_to_ids("<|im_start|>")).nonzero()[:, 0].tolist()
    tool_turn = slice(starts[-2], starts[-1])
    assert (labels[tool_turn] == IGNORE_INDEX).all()
    assert int((batch["mm_token_type_ids"][0][tool_turn] == 2).sum()) == int(batch["video_grid_thw"][1].prod()) // 4
    assert "Frames" in tok.decode(batch["input_ids"][0][tool_turn])
    with torch.no_grad():
        out = model(**batch)
    logits = out.logits[0, :-1].float()
    target = labels[1:]
    keep = target != IGNORE_INDEX
    by_hand = torch.nn.functional.cross_entropy(logits[keep], target[keep])
    assert torch.isfinite(out.loss) and out.loss.item() == pytest.approx(by_hand.item(), rel=1e-5)

    out_dir = tmp_path / "sft"
    assert main([
        "--config", "configs/demo_sft.yaml", "--model_name_or_path", str(bpe_tiny_model_dir),
        "--train_file", str(demo_dir / "train.jsonl"), "--output_dir", str(out_dir), "--max_train_samples", "2",
        "--per_device_train_batch_size", "2", "--max_steps", "1", "--warmup_steps", "0", "--logging_steps", "1",
        "--save_strategy", "no", "--disable_tqdm", "true", "--crop_trajectory_fraction", "1",
        "--max_tool_calling_iterations", "2",
    ]) == 0
    losses = [h["loss"] for h in json.loads((out_dir / "trainer_state.json").read_text())["log_history"]
              if "loss" in h]
    assert len(losses) == 1 and 0 < losses[0] < 100
