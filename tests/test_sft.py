"""Supervised warm start: targets, label masking, the YAML config, and a short real run through ``grounding-rl sft``."""
import json
from pathlib import Path

import pytest
import torch

from grounding_rl.cli.common import parse_training_args
from grounding_rl.data.dataset import GroundingDataset
from grounding_rl.prompts.templates import answer_text as sft_target
from grounding_rl.update.sft import IGNORE_INDEX, GroundingSFTConfig, SFTCollator

torch.set_num_threads(1)
REPO = Path(__file__).resolve().parent.parent
DEMO_VIDEO = dict(fps=2.0, min_pixels=3136, max_pixels=3136)


@pytest.fixture(scope="module")
def bpe_model_dir(bpe_tiny_model_dir):
    return bpe_tiny_model_dir


def parse_args(argv):
    script, args, model_args = parse_training_args(GroundingSFTConfig, argv, "grounding-rl sft")
    return script, args, model_args


def demo_items(demo_dir, n):
    from grounding_rl.data.samples import load_samples

    dataset = GroundingDataset(load_samples(demo_dir / "train.jsonl")[:n])
    return dataset, [dataset[i] for i in range(len(dataset))]


def test_target_round_trips_through_the_answer_parser():
    from grounding_rl.prompts.parsing import extract_think, parse_answer

    text = sft_target(3.5, 12.25)
    assert text == ("<think>The event is visible in the video, so I find when it starts and ends.</think>"
                    "<answer>3.50 to 12.25</answer>")
    assert parse_answer(text) == (3.5, 12.25)
    assert extract_think(text) == "The event is visible in the video, so I find when it starts and ends."
    assert sft_target(0.004, 7.999, "x") == "<think>x</think><answer>0.00 to 8.00</answer>"


@pytest.mark.parametrize("which", ["bpe", "qwen"])
def test_collator_trains_only_the_target(which, demo_dir, bpe_model_dir, qwen_processor_dir):
    from transformers import AutoProcessor

    from grounding_rl.data.video import VideoSettings, sample_frames
    from grounding_rl.prompts.preprocessing import build_inputs
    from grounding_rl.prompts.templates import render_prompt

    processor = AutoProcessor.from_pretrained(bpe_model_dir if which == "bpe" else qwen_processor_dir)
    tok = processor.tokenizer
    dataset, rows = demo_items(demo_dir, 3)
    settings = VideoSettings(**DEMO_VIDEO)
    batch = SFTCollator(processor, dataset, "default", settings)(rows)
    prompt = build_inputs(processor, [r["query"] for r in rows], [sample_frames(r["video"], settings) for r in rows])

    assert batch["input_ids"].shape == batch["labels"].shape == batch["mm_token_type_ids"].shape
    assert torch.equal(batch["video_grid_thw"], prompt["video_grid_thw"])
    assert torch.equal(batch["pixel_values_videos"], prompt["pixel_values_videos"])
    assert batch["second_per_grid_ts"].tolist() == [1.0, 1.0, 1.0]
    for i, row in enumerate(rows):
        mask = batch["attention_mask"][i].bool()
        ids, labels = batch["input_ids"][i][mask], batch["labels"][i][mask]
        assert (batch["labels"][i][~mask] == IGNORE_INDEX).all() and mask[-1]  # left padding
        n_prompt = int(prompt["attention_mask"][i].sum())
        # the prompt part is exactly build_inputs' tokens, all masked; the rest is the target, all trained
        assert torch.equal(ids[:n_prompt], prompt["input_ids"][i][prompt["attention_mask"][i].bool()])
        assert (labels[:n_prompt] == IGNORE_INDEX).all()
        assert torch.equal(labels[n_prompt:], ids[n_prompt:])
        target = sft_target(row["start"], row["end"]) + "<|im_end|>"
        assert tok.decode(labels[n_prompt:]) == target
        assert int(ids[n_prompt:][-1]) == tok.convert_tokens_to_ids("<|im_end|>")
        assert (batch["mm_token_type_ids"][i][mask][n_prompt:] == 0).all()
        # tokenising the target alone equals tokenising prompt + target as one text
        text = render_prompt(processor, row["query"])
        assert tok(text + target).input_ids == tok(text).input_ids + tok(target).input_ids


def test_collator_thinking_free_target_is_the_answer_alone(demo_dir, bpe_model_dir):
    from transformers import AutoProcessor

    from grounding_rl.data.video import VideoSettings

    processor = AutoProcessor.from_pretrained(bpe_model_dir)
    dataset, rows = demo_items(demo_dir, 2)
    batch = SFTCollator(processor, dataset, "default_no_think", VideoSettings(**DEMO_VIDEO), "ignored")(rows)
    for i, row in enumerate(rows):
        labels = batch["labels"][i][batch["labels"][i] != IGNORE_INDEX]
        target = processor.tokenizer.decode(labels)
        assert target == f"<answer>{row['start']:.2f} to {row['end']:.2f}</answer><|im_end|>"
        assert "think" not in target


def test_collator_rejects_long_prompts_naming_the_sample(demo_dir, bpe_model_dir):
    from transformers import AutoProcessor

    from grounding_rl.data.video import VideoSettings

    processor = AutoProcessor.from_pretrained(bpe_model_dir)
    dataset, rows = demo_items(demo_dir, 1)
    with pytest.raises(ValueError, match="demo:train_00000.*max_prompt_length 50"):
        SFTCollator(processor, dataset, "default", VideoSettings(**DEMO_VIDEO), max_prompt_length=50)(rows)


def test_config_validation(tmp_path):
    from grounding_rl.errors import UserError

    with pytest.raises(ValueError, match="prompt_template 'nope'"):
        GroundingSFTConfig(output_dir=str(tmp_path), prompt_template="nope")
    with pytest.raises(UserError, match="train_file is required"):
        parse_args(["--output_dir", str(tmp_path), "--model_name_or_path", "m"])
    args = GroundingSFTConfig(output_dir=str(tmp_path), video_max_pixels=3136, video_min_pixels=3136)
    config = args.grounding_config()
    assert config.video.max_pixels == 3136 and config.prompt_template == "default" and config.reward_funcs == []


def test_demo_config_parses_with_overrides():
    script, args, model_args = parse_args(["--config", "configs/demo_sft.yaml", "--learning_rate", "0.01"])
    assert args.learning_rate == 0.01 and args.use_cpu
    assert script.train_file == str(REPO / "data" / "demo" / "train.jsonl")
    # not built yet: kept as written (could be a hub id); an existing folder becomes absolute
    assert model_args.model_name_or_path in ("outputs/tiny-model", str(REPO / "outputs" / "tiny-model"))
    assert args.video_settings.max_pixels == 3136 and args.video_fps == 2.0
    from grounding_rl.errors import UserError

    with pytest.raises(UserError, match="unknown option --no_such_key"):
        parse_args(["--config", "configs/demo_sft.yaml", "--no_such_key", "1"])


def test_short_sft_run_lowers_the_loss_and_saves(demo_dir, bpe_model_dir, tmp_path):
    from safetensors.torch import load_file
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from grounding_rl.prompts.preprocessing import GroundingConfig

    from grounding_rl.cli.sft import main

    out = tmp_path / "sft"
    assert main([
        "--config", "configs/demo_sft.yaml", "--model_name_or_path", str(bpe_model_dir),
        "--train_file", str(demo_dir / "train.jsonl"), "--output_dir", str(out), "--max_train_samples", "4",
        "--per_device_train_batch_size", "2", "--max_steps", "8", "--warmup_steps", "0", "--learning_rate", "3e-3",
        "--lr_scheduler_type", "constant", "--logging_steps", "1", "--save_strategy", "steps", "--save_steps", "4",
        "--disable_tqdm", "true",
    ]) == 0
    # the files open-r1 / TRL scripts leave in the output folder
    assert json.loads((out / "trainer_state.json").read_text())["global_step"] == 8
    assert json.loads((out / "train_results.json").read_text())["train_samples"] == 4
    state = json.loads((out / "checkpoint-8" / "trainer_state.json").read_text())
    losses = [h["loss"] for h in state["log_history"] if "loss" in h]
    assert len(losses) == 8
    assert sum(losses[-2:]) / 2 < sum(losses[:2]) / 2 - 0.5, losses
    for folder in (out, out / "checkpoint-4", out / "checkpoint-8"):
        config = GroundingConfig.load(folder)
        assert config is not None and config.video.max_pixels == 3136 and config.prompt_template == "default"
    model = AutoModelForImageTextToText.from_pretrained(out)
    assert type(model).__name__ == "Qwen2_5_VLForConditionalGeneration"
    assert AutoProcessor.from_pretrained(out).tokenizer.eos_token == "<|im_end|>"
    before = load_file(str(bpe_model_dir / "model.safetensors"))
    after = load_file(str(out / "model.safetensors"))
    assert before.keys() == after.keys()
    embed = next(k for k in before if k.endswith("embed_tokens.weight"))
    assert not torch.equal(before[embed], after[embed])


def test_an_unreadable_clip_is_substituted_not_fatal(demo_dir, bpe_model_dir, tmp_path):
    """Like GRPO: a clip that fails to load is replaced by its deterministic substitute (index + 1), never a crash."""
    from transformers import AutoProcessor

    from grounding_rl.data.samples import load_samples
    from grounding_rl.data.video import VideoSettings

    broken = tmp_path / "broken.mp4"
    broken.write_bytes(b"not a video")
    samples = [s.to_dict() for s in load_samples(demo_dir / "train.jsonl")[:3]]
    samples[1]["video"] = str(broken)
    dataset = GroundingDataset(samples)
    processor = AutoProcessor.from_pretrained(bpe_model_dir)
    batch = SFTCollator(processor, dataset, "default", VideoSettings(**DEMO_VIDEO))(
        [dataset[i] for i in range(3)])
    tok = processor.tokenizer
    targets = []
    for i in range(3):
        labels = batch["labels"][i]
        targets.append(tok.decode(labels[labels != IGNORE_INDEX]))
    expected = [sft_target(samples[j]["start"], samples[j]["end"]) + "<|im_end|>" for j in (0, 2, 2)]
    assert targets == expected


def test_sft_runs_on_a_tiny_qwen3_vl(tiny_qwen3_model_dir, videos_dir, tmp_path):
    """SFT on the other family: a tiny Qwen3-VL on the real clips (textual timestamps in the prompt, frames sized for
    its 32-pixel factor) trains, and its checkpoint records the preprocessing as sampled."""
    from transformers import AutoModelForImageTextToText

    from grounding_rl.cli.sft import main
    from grounding_rl.prompts.preprocessing import GroundingConfig

    out = tmp_path / "sft_qwen3"
    assert main([
        "--config", "configs/demo_sft.yaml", "--model_name_or_path", str(tiny_qwen3_model_dir),
        "--train_file", str(videos_dir / "annotations.jsonl"), "--output_dir", str(out), "--max_train_samples", "2",
        "--per_device_train_batch_size", "2", "--max_steps", "2", "--warmup_steps", "0", "--learning_rate", "1e-3",
        "--logging_steps", "1", "--save_strategy", "no", "--disable_tqdm", "true", "--video_fps", "1",
        "--video_min_pixels", "4096", "--video_max_pixels", "12544",
    ]) == 0
    losses = [h["loss"] for h in json.loads((out / "trainer_state.json").read_text())["log_history"] if "loss" in h]
    assert len(losses) == 2 and all(0 < x < 100 for x in losses)
    assert GroundingConfig.load(out).video.pixel_factor == 32
    assert type(AutoModelForImageTextToText.from_pretrained(out)).__name__ == "Qwen3VLForConditionalGeneration"


def test_collator_uses_each_rows_own_template(demo_dir, bpe_model_dir):
    """A training set mixing sources: a row with ``prompt_template: timelens2`` gets that prompt and its JSON-array
    target; the other row the run's template."""
    from transformers import AutoProcessor

    from grounding_rl.data.samples import load_samples
    from grounding_rl.data.video import VideoSettings

    processor = AutoProcessor.from_pretrained(bpe_model_dir)
    samples = [s.to_dict() for s in load_samples(demo_dir / "train.jsonl")[:2]]
    dataset = GroundingDataset([{**samples[0], "prompt_template": "timelens2"}, samples[1]])
    rows = [dataset[i] for i in range(2)]
    batch = SFTCollator(processor, dataset, "default_no_think", VideoSettings(**DEMO_VIDEO))(rows)
    targets = [processor.tokenizer.decode(batch["labels"][i][batch["labels"][i] != IGNORE_INDEX]) for i in range(2)]
    assert targets[0] == f"[[{rows[0]['start']:.2f}, {rows[0]['end']:.2f}]]<|im_end|>"
    assert targets[1] == f"<answer>{rows[1]['start']:.2f} to {rows[1]['end']:.2f}</answer><|im_end|>"
    prompts = processor.tokenizer.batch_decode(batch["input_ids"])
    assert "Task: temporal retrieval." in prompts[0] and "Task: temporal retrieval." not in prompts[1]
