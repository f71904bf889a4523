"""The tiny model builder: with the real Qwen tokenizer and with the locally trained BPE tokenizer."""
import json

import pytest
import torch

from grounding_rl.dev.tiny import QWEN_TOKEN_IDS, build_tiny_model
from grounding_rl.dev.tiny_tokenizer import SPECIAL_TOKENS, build_processor, special_token_ids, train_bpe, \
    training_corpus

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def bpe_processor():
    return build_processor()


@pytest.fixture(scope="module")
def bpe_model_dir(bpe_tiny_model_dir):
    return bpe_tiny_model_dir


def test_bpe_special_tokens_follow_qwen_order(bpe_processor):
    tok = bpe_processor.tokenizer
    ids = [tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS]
    first = ids[0]
    assert ids == list(range(first, first + len(SPECIAL_TOKENS)))  # <|endoftext|> = V, <|im_start|> = V+1, ...
    assert len(tok) == first + len(SPECIAL_TOKENS)
    assert set(bpe_processor.token_ids) == set(QWEN_TOKEN_IDS)
    assert bpe_processor.token_ids["eos_token_id"] == first + 2  # <|im_end|>
    assert bpe_processor.token_ids["pad_token_id"] == bpe_processor.token_ids["bos_token_id"] == first
    assert bpe_processor.token_ids["video_token_id"] == first + 13
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    assert 300 < first <= 4096  # a small vocabulary (the real one has 151,643 BPE tokens)


def test_bpe_digits_are_single_tokens_and_tags_compact(bpe_processor):
    tok = bpe_processor.tokenizer
    assert tok.tokenize("12.54 to 17.83") == ["1", "2", ".", "5", "4", "Ġto", "Ġ", "1", "7", ".", "8", "3"]
    ids = tok("<answer>3.50 to 9.00</answer><|im_end|>", add_special_tokens=False).input_ids
    assert ids[-1] == bpe_processor.token_ids["eos_token_id"]
    assert len(ids) == 17  # "<" "answer" ">" 3 . 5 0 " to" " " 9 . 0 0 "</" "answer" ">" <|im_end|>
    # unseen text falls back to bytes and round-trips
    text = "Zebra quokka 42 ünïcode"
    assert tok.decode(tok(text).input_ids) == text
    # special tokens are skipped when decoding, like Qwen's
    assert tok.decode(tok("<|im_start|>assistant\nok<|im_end|>").input_ids, skip_special_tokens=True) == "assistant\nok"


def test_bpe_training_is_deterministic():
    a = train_bpe(training_corpus())
    b = train_bpe(training_corpus())
    assert a == b


def test_bpe_chat_template_renders_like_qwen(bpe_processor, qwen_processor_dir):
    from transformers import AutoProcessor

    from grounding_rl.prompts.templates import render_prompt

    real = AutoProcessor.from_pretrained(qwen_processor_dir)
    for template in ("default", "timezero"):
        ours = render_prompt(bpe_processor, "the red circle appears.", template)
        assert ours == render_prompt(real, "the red circle appears.", template)
    assert ours.endswith("<|vision_start|><|video_pad|><|vision_end|><|im_end|>\n<|im_start|>assistant\n")


def test_build_without_tokenizer_reloads_and_generates(bpe_model_dir, videos_dir):
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from grounding_rl.data.video import VideoSettings, sample_frames
    from grounding_rl.prompts.preprocessing import build_inputs

    processor = AutoProcessor.from_pretrained(bpe_model_dir)
    model = AutoModelForImageTextToText.from_pretrained(bpe_model_dir).eval()
    assert type(model).__name__ == "Qwen2_5_VLForConditionalGeneration"
    ids = special_token_ids(processor.tokenizer)
    assert model.config.video_token_id == ids["video_token_id"]
    assert model.config.vision_start_token_id == ids["vision_start_token_id"]
    assert model.config.text_config.vocab_size >= len(processor.tokenizer)
    assert model.config.text_config.vocab_size % 64 == 0
    assert model.generation_config.eos_token_id == [ids["eos_token_id"], ids["pad_token_id"]]
    n_params = sum(p.numel() for p in model.parameters())
    assert n_params < 1_000_000  # the small vocabulary keeps the whole model tiny

    settings = VideoSettings(min_pixels=3136, max_pixels=3136)
    videos = [sample_frames(videos_dir / "mmaction2_pool_cleaning.mp4", settings),
              sample_frames(videos_dir / "mmaction2_eye_makeup.avi", settings)]
    batch = build_inputs(processor, ["a person cleans the pool.", "a person applies eye makeup."], videos)
    n_video_tokens = int((batch["input_ids"] == ids["video_token_id"]).sum())
    assert n_video_tokens == int(batch["video_grid_thw"].prod(-1).sum()) // 4  # 2x2 merge
    with torch.no_grad():
        logits = model(**batch).logits
        out = model.generate(**batch, max_new_tokens=6, do_sample=False)
    assert logits.shape == (*batch["input_ids"].shape, model.config.text_config.vocab_size)
    assert torch.isfinite(logits).all()
    assert out.shape[0] == 2 and batch["input_ids"].shape[1] < out.shape[1] <= batch["input_ids"].shape[1] + 6
    config = json.loads((bpe_model_dir / "config.json").read_text())
    assert config["architectures"] == ["Qwen2_5_VLForConditionalGeneration"]


def test_build_is_deterministic_for_a_seed(bpe_model_dir, tmp_path):
    from safetensors.torch import load_file

    again = build_tiny_model(tmp_path / "again", tokenizer=None, seed=0)
    a, b = load_file(str(bpe_model_dir / "model.safetensors")), load_file(str(again / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert (bpe_model_dir / "tokenizer.json").read_text() == (again / "tokenizer.json").read_text()


def test_build_with_real_tokenizer(tiny_model_dir, qwen_processor_dir):
    from transformers import AutoModelForImageTextToText, AutoProcessor

    processor = AutoProcessor.from_pretrained(tiny_model_dir)
    model = AutoModelForImageTextToText.from_pretrained(tiny_model_dir)
    assert len(processor.tokenizer) == 151665
    assert processor.tokenizer.convert_tokens_to_ids("<|video_pad|>") == model.config.video_token_id == 151656
    assert model.config.text_config.vocab_size == 151680  # 151,665 rounded up to a multiple of 64
    real = AutoProcessor.from_pretrained(qwen_processor_dir)
    assert processor.chat_template == real.chat_template


def test_cli_without_tokenizer(tmp_path, capsys):
    from grounding_rl.cli.tiny_model import main

    assert main(["--out", str(tmp_path / "m"), "--hidden-size", "32", "--num-layers", "1"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["parameters"] < 200_000
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    assert config["text_config"]["hidden_size"] == 32 and config["text_config"]["num_hidden_layers"] == 1


def test_like_qwen3_keeps_the_architecture_and_deepstack(tiny_qwen3_model_dir, qwen3_processor_dir):
    from transformers import AutoModelForImageTextToText, AutoProcessor

    processor = AutoProcessor.from_pretrained(tiny_qwen3_model_dir)
    model = AutoModelForImageTextToText.from_pretrained(tiny_qwen3_model_dir)
    real = AutoProcessor.from_pretrained(qwen3_processor_dir)
    assert type(model).__name__ == "Qwen3VLForConditionalGeneration" and type(processor).__name__ == "Qwen3VLProcessor"
    assert len(processor.tokenizer) == 151669 and model.config.text_config.vocab_size == 151680
    assert processor.chat_template == real.chat_template
    assert processor.video_processor.patch_size == 16 and processor.video_processor.merge_size == 2
    vision = model.config.vision_config
    assert vision.depth == 4 and vision.deepstack_visual_indexes == [0, 1, 2]  # 8, 16, 24 of 27, scaled to 4 blocks
    assert len(model.model.visual.deepstack_merger_list) == 3
    assert model.config.text_config.num_hidden_layers == 3  # each DeepStack feature has an LLM layer to feed
    rope = model.config.text_config.rope_parameters
    assert rope["mrope_interleaved"] and rope["mrope_section"] == [4, 2, 2]  # head_dim 16 → half 8, 24:20:20 of 64
    assert model.config.video_token_id == processor.tokenizer.convert_tokens_to_ids("<|video_pad|>") == 151656
    assert model.generation_config.eos_token_id == [151645, 151643]


def test_like_qwen2_5_equals_tokenizer_build(tmp_path, tiny_model_dir, qwen_processor_dir):
    """--like on the Qwen2.5-VL folder builds the same model as the old --tokenizer."""
    from safetensors.torch import load_file

    from grounding_rl.cli.tiny_model import main

    assert main(["--out", str(tmp_path / "like"), "--like", str(qwen_processor_dir)]) == 0
    a, b = load_file(str(tiny_model_dir / "model.safetensors")), load_file(str(tmp_path / "like" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_like_a_synthetic_qwen3_moe(tmp_path, qwen3_processor_dir, videos_dir):
    """qwen3_vl_moe goes through the Qwen3-VL family: a tiny MoE built from the 8B's files with a MoE config.json."""
    import shutil

    from transformers import AutoModelForImageTextToText

    from grounding_rl.data.video import VideoSettings, sample_frames
    from grounding_rl.family import family_of
    from grounding_rl.models.loading import load_processor
    from grounding_rl.rollout.generation import SamplingParams, generate_answers

    folder = tmp_path / "moe_like"
    shutil.copytree(qwen3_processor_dir, folder)
    config = json.loads((folder / "config.json").read_text())
    config.update(model_type="qwen3_vl_moe", architectures=["Qwen3VLMoeForConditionalGeneration"])
    config["text_config"].update(model_type="qwen3_vl_moe_text", num_experts=128, num_experts_per_tok=8,
                                 moe_intermediate_size=768, decoder_sparse_step=1)
    (folder / "config.json").write_text(json.dumps(config))
    out = build_tiny_model(tmp_path / "moe", like=folder)
    model = AutoModelForImageTextToText.from_pretrained(out).eval()
    assert type(model).__name__ == "Qwen3VLMoeForConditionalGeneration"
    assert family_of(model).name == "qwen3_vl" and model.config.text_config.num_experts == 4
    processor = load_processor(str(out))
    video = sample_frames(videos_dir / "mmaction2_eye_makeup.avi",
                          family_of(model).video_settings(VideoSettings(min_pixels=4096, max_pixels=4096)))
    answers = generate_answers(model, processor, ["q one.", "q two."], [video, video], "default",
                               SamplingParams.greedy(4))
    assert len(answers) == 2 and all(isinstance(a, str) for a in answers)


def test_like_qwen3_with_the_local_tokenizer(tmp_path, qwen3_processor_dir):
    """``tokenizer: local`` with ``like``: the Qwen3-VL architecture and processor settings, the small BPE vocabulary
    (the demo's), and the BPE vocabulary does not depend on which templates exist beyond the corpus's two."""
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from grounding_rl.dev.tiny_tokenizer import build_tokenizer

    out = build_tiny_model(tmp_path / "q3bpe", tokenizer="local", like=qwen3_processor_dir, num_layers=3)
    processor = AutoProcessor.from_pretrained(out)
    model = AutoModelForImageTextToText.from_pretrained(out)
    assert type(processor).__name__ == "Qwen3VLProcessor" and processor.video_processor.patch_size == 16
    assert len(processor.tokenizer) == len(build_tokenizer()) < 1000
    assert processor.chat_template == AutoProcessor.from_pretrained(qwen3_processor_dir).chat_template
    assert model.config.video_token_id == processor.tokenizer.convert_tokens_to_ids("<|video_pad|>")
    assert len(model.model.visual.deepstack_merger_list) == 3


def test_tiny_model_refuses_a_run_it_did_not_write(tmp_path, capsys):
    """Over a finished run (weights, config and trainer state of something else) tiny-model is one line naming the
    folder and the first such file, and every file is kept; its own folder (tiny_model.json) is rebuilt without a flag,
    removing only the files its record lists; --overwrite writes over the run and leaves its other files."""
    from grounding_rl.cli import main as cli

    run = tmp_path / "run"
    (run / "checkpoint-2").mkdir(parents=True)
    for name in ("config.json", "model.safetensors", "trainer_state.json", "checkpoint-2/model.safetensors"):
        (run / name).write_text("the run's")
    small = ["--hidden-size", "32", "--num-layers", "1"]
    assert cli(["tiny-model", "--out", str(run), *small]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"grounding-rl tiny-model: error: --out {run} holds files tiny-model did not write "
                   "(checkpoint-2/model.safetensors and 3 more); give a new or empty --out, or --overwrite to write "
                   "over it")
    assert all(p.read_text() == "the run's" for p in run.rglob("*") if p.is_file())

    own = tmp_path / "own"
    assert cli(["tiny-model", "--out", str(own), *small]) == 0
    record = json.loads((own / "tiny_model.json").read_text())
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(record["files"])
    (own / "stale.bin").write_text("an earlier build's")
    (own / "tiny_model.json").write_text(json.dumps({**record, "files": record["files"] + ["stale.bin"]}))
    assert cli(["tiny-model", "--out", str(own), "--hidden-size", "64", "--num-layers", "1"]) == 0
    assert json.loads((own / "config.json").read_text())["text_config"]["hidden_size"] == 64
    assert not (own / "stale.bin").exists()

    assert cli(["tiny-model", "--out", str(run), *small, "--overwrite"]) == 0
    assert json.loads((run / "config.json").read_text())["text_config"]["hidden_size"] == 32
    assert (run / "trainer_state.json").read_text() == "the run's"  # left beside it, not listed as tiny-model's
    assert "trainer_state.json" not in json.loads((run / "tiny_model.json").read_text())["files"]
