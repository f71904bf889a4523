"""grounding-rl infer: intervals clamped to the video, --json, --plot, exit code 2."""
import json
import os
import subprocess
import sys

import pytest
import torch

from grounding_rl.cli import infer as infer_cli
from grounding_rl.data import video as video_module
from grounding_rl.data.video import VideoSettings, sample_frames
from grounding_rl.eval import engines
from grounding_rl.eval import infer as inf
from grounding_rl.eval.gallery import plot_timeline
from grounding_rl.paths import REPO_ROOT

torch.set_num_threads(1)

FAST = ["--fps", "1", "--max-pixels", str(28 * 28 * 16), "--min-pixels", str(28 * 28 * 4), "--max-new-tokens", "12"]
KEYS = {"query", "start", "end", "answer", "reasoning", "sampling"}
QUERIES = ["person sitting down in a chair.", "a person is eating some food."]


def _png_size(path):
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def test_answer_result_clamps_to_the_video():
    r = inf.answer_result("q", "<think>at the end</think><answer>30.0 to 50.0</answer>", 35.2)
    assert r == {"query": "q", "start": 30.0, "end": 35.2, "answer": "<think>at the end</think><answer>30.0 to 50.0"
                 "</answer>", "reasoning": "at the end"}
    assert inf.answer_result("q", "I cannot tell", 35.2)["start"] is None


def test_infer_real_tiny_model_json_and_plot(tiny_model_dir, videos_dir, tmp_path, capsys, monkeypatch):
    """Two queries on one clip: the clip is decoded once and encoded once, and the answers are those of one query at
    a time (sharing the encoding changes nothing)."""
    from grounding_rl.models.loading import load_for_inference, vision_tower
    from grounding_rl.rollout.generation import SamplingParams, generate_answers

    decodes, encodings, loaded = [], [], {}

    def counting_sample_frames(*args, **kwargs):
        decodes.append(args[0])
        return sample_frames(*args, **kwargs)

    def counting_load(*args, **kwargs):
        model, processor = load_for_inference(*args, **kwargs)
        vision_tower(model).register_forward_hook(lambda *a: encodings.append(1))
        loaded.update(model=model, processor=processor)
        return model, processor

    monkeypatch.setattr(video_module, "sample_frames", counting_sample_frames)
    monkeypatch.setattr(engines, "load_for_inference", counting_load)
    plot = tmp_path / "timeline.png"
    rc = infer_cli.main(["--model", str(tiny_model_dir), "--video", str(videos_dir / "charades_OHOFG.mp4"),
                   "--query", QUERIES[0], "--query", QUERIES[1], "--gt", "1.0", "7.5", "--gt", "22.3", "33.0",
                   "--plot", str(plot), "--json", *FAST])
    assert rc == 0
    assert len(decodes) == 1 and len(encodings) == 1
    out = capsys.readouterr().out
    results = json.loads(out)  # stdout is exactly one JSON list
    assert isinstance(results, list) and [r["query"] for r in results] == QUERIES
    assert all(set(r) == KEYS for r in results)
    clip = sample_frames(videos_dir / "charades_OHOFG.mp4", VideoSettings(fps=1.0, max_pixels=28 * 28 * 16,
                                                                          min_pixels=28 * 28 * 4))
    alone = [generate_answers(loaded["model"], loaded["processor"], [q], [clip], "default",
                              SamplingParams.greedy(12))[0] for q in QUERIES]
    assert [r["answer"] for r in results] == alone
    assert results[0]["sampling"] == clip.sampling() == {"fps": 1.0, "frames": 34, "height": 84, "width": 140}
    width, height = _png_size(plot)
    assert width > 800 and height > 300


@pytest.fixture
def fake_model(monkeypatch):
    """Replace model loading and generation: answers are chosen per query, so clamping and JSON can be checked."""
    answers = {
        "late": "<think>near the end</think><answer>30.00 to 50.00</answer>",
        "early": "<think>she sits</think><answer>1.50 to 7.50</answer>",
        "none": "I do not know",
    }
    calls = []

    def generate(model, processor, queries, videos, template, params, video_layout):
        calls.append((list(queries), template, params.max_new_tokens, videos[0].num_frames, video_layout))
        return [answers[q] for q in queries]

    monkeypatch.setattr(engines, "load_for_inference", lambda *a, **k: (None, None))
    from grounding_rl.rollout import greedy

    monkeypatch.setattr(greedy, "generate_answers", generate)
    return calls


def test_infer_json_clamps_intervals_with_a_fake_model(fake_model, videos_dir, tmp_path, capsys):
    plot = tmp_path / "t.png"
    rc = infer_cli.main(["--model", str(tmp_path), "--video", str(videos_dir / "charades_OHOFG.mp4"), "--query", "late",
                   "--query", "early", "--query", "none", "--json", "--plot", str(plot), "--batch-size", "2", *FAST])
    assert rc == 0
    captured = capsys.readouterr()
    results = json.loads(captured.out)
    duration = sample_frames(videos_dir / "charades_OHOFG.mp4", VideoSettings(fps=1.0)).duration
    assert 35.0 < duration <= 35.3
    assert results[0]["start"] == 30.0 and results[0]["end"] == pytest.approx(duration)  # 50 clamped to the clip
    assert (results[1]["start"], results[1]["end"], results[1]["reasoning"]) == (1.5, 7.5, "she sits")
    assert results[2]["start"] is None and results[2]["end"] is None and results[2]["reasoning"] is None
    assert "built-in defaults" in captured.err  # notices go to stderr under --json
    assert [c[0] for c in fake_model] == [["late", "early"], ["none"]]  # batched, in order
    assert fake_model[0][1] == "default" and fake_model[0][2] == 12 and fake_model[0][4] == "released"
    assert _png_size(plot)[0] > 800


def test_infer_text_output(fake_model, videos_dir, tmp_path, capsys):
    rc = infer_cli.main(["--model", str(tmp_path), "--video", str(videos_dir / "charades_OHOFG.mp4"), "--query", "early",
                   "--query", "none", "--video-layout", "transformers5", *FAST])
    assert rc == 0
    out = capsys.readouterr().out
    assert "interval: 1.50 s to 7.50 s" in out and "reasoning: she sits" in out
    assert "video_layout=transformers5" in out and {c[4] for c in fake_model} == {"transformers5"}
    assert "(no parseable answer)" in out


def test_missing_video_is_exit_code_2(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(engines, "load_for_inference", lambda *a, **k: pytest.fail("the model must not be loaded"))
    missing = tmp_path / "nowhere.mp4"
    assert infer_cli.main(["--model", str(tmp_path), "--video", str(missing), "--query", "x"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(missing) in err

    unreadable = tmp_path / "notes.mp4"
    unreadable.write_text("not a video")
    assert infer_cli.main(["--model", str(tmp_path), "--video", str(unreadable), "--query", "x"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "notes.mp4" in err


def test_missing_video_from_the_command_line(tmp_path):
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(REPO_ROOT))
    proc = subprocess.run([sys.executable, "-m", "grounding_rl.cli", "infer", "--model", str(tmp_path), "--video",
                           str(tmp_path / "gone.mp4"), "--query", "x", "--json"], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().splitlines()[-1].endswith("gone.mp4")


def test_gt_must_match_the_queries(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        infer_cli.main(["--model", str(tmp_path), "--video", "v.mp4", "--query", "a", "--query", "b", "--gt", "1", "2"])
    assert exit_.value.code == 2
    assert "one per query" in capsys.readouterr().err


def test_plot_timeline_draws_predictions_and_ground_truth(videos_dir, tmp_path):
    video = sample_frames(videos_dir / "mmaction2_eye_makeup.avi", VideoSettings(fps=2.0, max_pixels=28 * 28 * 16,
                                                                                  min_pixels=28 * 28 * 4))
    path = plot_timeline(video, [{"query": "eye makeup", "start": 0.5, "end": 6.0},
                                 {"query": "unparsed", "start": None, "end": None}],
                         tmp_path / "p.png", gts=[(0.0, 6.5), (1.0, 2.0)])
    width, height = _png_size(path)
    assert width > 800 and height > 250


def test_an_unwritable_plot_is_a_warning_after_the_answer(fake_model, videos_dir, tmp_path, capsys):
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    rc = infer_cli.main(["--model", str(tmp_path), "--video", str(videos_dir / "charades_OHOFG.mp4"), "--query", "early",
                   "--plot", str(blocker / "t.png"), *FAST])
    assert rc == 0
    captured = capsys.readouterr()
    assert "interval: 1.50 s to 7.50 s" in captured.out  # the answer is printed
    warnings = [line for line in captured.err.splitlines() if "no plot written" in line]
    assert len(warnings) == 1 and "a_file" in warnings[0] and "Traceback" not in captured.err
def test_print_prompt_shows_what_the_model_is_given(family_model_dir, videos_dir, capsys):
    """Either family: the printed prompt is the decoded model input (special tokens, the query, video tokens as a
    count; Qwen3-VL's textual timestamps = the frames' true times), and inference still answers."""
    from grounding_rl.family import family_of_checkpoint

    rc = infer_cli.main(["--model", str(family_model_dir), "--video", str(videos_dir / "mmaction2_eye_makeup.avi"),
                   "--query", QUERIES[0], "--print-prompt", "--fps", "2", "--max-pixels", str(32 * 32 * 4),
                   "--min-pixels", str(32 * 32 * 4), "--max-new-tokens", "4"])
    assert rc == 0
    out = capsys.readouterr().out
    prompt = out.split(f"infer: prompt for {QUERIES[0]!r}:\n", 1)[1].split("<|im_start|>assistant\n", 1)[0]
    assert prompt.startswith("<|im_start|>") and QUERIES[0] in prompt
    counts = [int(n) for n in __import__("re").findall(r"<\|video_pad\|>×(\d+)", prompt)]
    if family_of_checkpoint(family_model_dir).name == "qwen3_vl":
        # 12 frames at 0, 0.48, 1.0, 1.52, ... s: one block of 2 tokens (64x32 frames) per pair, after its time
        assert counts == [2] * 6
        assert "<0.2 seconds><|vision_start|><|video_pad|>×2<|vision_end|><1.3 seconds>" in prompt
    else:
        assert counts == [12]  # one run: 12 frames of 28x56 → 6 temporal patches × (2·4 patches / 4)
        assert "seconds>" not in prompt and "<|vision_start|><|video_pad|>×12<|vision_end|>" in prompt
    assert "[1] " + QUERIES[0] in out  # the answer follows


def test_plot_path_is_the_file_written_and_checked_before_the_answer():
    """``--plot inf`` writes ``inf.png`` and says so; an extension matplotlib cannot write is refused up front."""
    from pathlib import Path

    from grounding_rl.errors import UserError
    from grounding_rl.eval.report import plot_path

    assert plot_path("inf") == Path("inf.png") and plot_path("out/t.PDF") == Path("out/t.PDF")
    with pytest.raises(UserError, match=r"--plot p\.xyz: matplotlib writes no \.xyz files; use one of .*\.png"):
        plot_path("p.xyz")


def test_video_min_frames_lowers_the_minimum_under_video_max_frames(tiny_model_dir):
    from grounding_rl.eval.settings import PreprocessingOverrides, resolve_config

    video = resolve_config(tiny_model_dir, PreprocessingOverrides(max_frames=3, min_frames=2))[0].video
    assert (video.min_frames, video.max_frames) == (2, 3)


def test_answer_spans_are_the_final_answer_in_the_videos_seconds():
    from grounding_rl.prompts.templates import PROMPT_TEMPLATES, is_set_template
    from grounding_rl.rollout.answering import Answer, _with_spans

    zoom = {"window": [10, 20], "fallback": False, "answer": "1 to 2", "interval": (11.0, 12.0), "sampling": None,
            "error": None}
    answers = [Answer(0, "<answer>3 to 7.5</answer>", None, None), Answer(1, None, "no clip", None),
               Answer(2, "3 to 7", None, None, zoom=zoom), Answer(3, "3 to 7", None, None, zoom={**zoom, "error": "w"}),
               Answer(4, "no idea", None, None)]
    assert [a.spans for a in _with_spans(answers, "default")] == [[(3.0, 7.5)], None, [(11.0, 12.0)], [(3.0, 7.0)],
                                                                  None]
    set_template = next(t for t in PROMPT_TEMPLATES if is_set_template(t))
    assert _with_spans([Answer(0, "[[0, 3.5], [10, 12]]", None, None)], set_template)[0].spans == [(0, 3.5), (10, 12)]


def test_a_gt_outside_the_clip_is_refused_and_one_past_its_end_a_warning(fake_model, videos_dir, tmp_path, capsys):
    """``--gt 40 50`` on the 35.14 s clip was drawn nowhere (only its legend entry); ``--gt 30 40`` is drawn clipped."""
    from grounding_rl.errors import UserError

    argv = ["--model", str(tmp_path), "--video", str(videos_dir / "charades_OHOFG.mp4"), "--query", "early",
            "--plot", str(tmp_path / "t.png"), *FAST]
    with pytest.raises(UserError) as refused:
        infer_cli.main([*argv, "--gt", "40", "50"])
    assert str(refused.value).startswith("--gt 1 of 1 (40 50) starts at or after the end of ")
    assert "charades_OHOFG.mp4 (35.14 s): nothing of it" in str(refused.value)
    assert fake_model == [] and not (tmp_path / "t.png").exists()  # before the model and the picture
    capsys.readouterr()
    assert infer_cli.main([*argv, "--gt", "30", "40"]) == 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert len(warnings) == 1 and warnings[0].startswith("infer: warning: --gt 1 of 1 (30 40) ends after ")
    assert warnings[0].endswith("charades_OHOFG.mp4 (35.14 s); drawn up to its end")
    assert (tmp_path / "t.png").is_file()
