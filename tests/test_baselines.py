"""Baseline presets (evaluation/<evaluator>_*.yaml): each evaluator's prompt verbatim, its decoding budget and frame
handling, and its scoring; lmms-eval's Qwen2.5-VL frame handling as the ``lmms_eval_qwen2_5_vl`` sampler."""
import json
import re

import numpy as np
import pytest
import yaml

from grounding_rl.eval.benchmarks import load_benchmark
from grounding_rl.paths import REPO_ROOT
from grounding_rl.prompts.templates import get_template, instruction

EVALUATION = REPO_ROOT / "evaluation"
CAPTION = "person turn a light on."

# The user text each evaluator builds for CAPTION, from its own strings (data, not code):
# lmms-eval @75571cf tasks/charades_sta/charades.yaml + utils.temporal_grounding_doc_to_text
LMMS_CHARADES_PRE = ("Please find the visual event described by a sentence in the video, determining its starting and "
                     "ending times. The format should be: 'The event happens in the start time - end time'. For "
                     "example, The event 'person turn a light on' happens in the 24.3 - 30.4 seonds. Now I will give "
                     "you the textual sentence: ")
LMMS_CHARADES_POST = "Please return its start time and end time."
# lmms-eval @75571cf tasks/timelens/timelens_charades.yaml + utils.timelens_doc_to_text; TimeLens2 @a5ce450
# TimeLensBase.GROUNDER_PROMPT (the same text)
LMMS_TIMELENS_PRE = "Please find the visual event described by the sentence '"
LMMS_TIMELENS_POST = ("', determining its starting and ending times. The format should be: 'The event happens in "
                      "<start time> - <end time> seconds'.")
# www-Ye/TimeZero @a7c3523 evaluate.py GROUND_TEMPLATE
TIMEZERO_GROUND = (
    'To accurately pinpoint the event "[EVENT]" in the video, determine the precise time period of the event.\n\n'
    "Output your thought process within the <think> </think> tags, including analysis with either specific timestamps "
    "(xx.xx) or time ranges (xx.xx to xx.xx) in <timestep> </timestep> tags.\n\nThen, provide the start and end times "
    "(in seconds, precise to two decimal places) in the format \"start time to end time\" within the <answer> </answer> "
    "tags. For example: \"12.54 to 17.83\".")
# xiaomi-research/time-r1 @7f2b594 src/vllm_inference/data/config.py DEFAULT_TG_PROMPT["r1"] (scripts/test.sh passes
# --use_r1_thinking_prompt; its --use_nothink also appends "<think>\n</think>\n" after the generation prompt, which
# no template here does)
TIME_R1_R1 = (
    'To accurately pinpoint the event "{}" in the video, determine the precise time period of the event.\n\n'
    "Output your thought process within the <think> </think> tags, including analysis with either specific time "
    "ranges (xx.xx to xx.xx) in <timestep> </timestep> tags.\n\nThen, provide the start and end times (in seconds, "
    'precise to two decimal places) in the format "start time to end time" within the <answer> </answer> tags. For '
    'example: "12.54 to 17.83".')
EXPECTED = {
    "lmms_eval_charades_sta": (f"{LMMS_CHARADES_PRE}{CAPTION}. {LMMS_CHARADES_POST}", True, 50,
                               "lmms_eval_qwen2_5_vl", "lmms_charades_sta"),
    "lmms_eval_timelens_charades": (f"{LMMS_TIMELENS_PRE}{CAPTION}{LMMS_TIMELENS_POST}", True, 50,
                                    "lmms_eval_qwen2_5_vl", "lmms_timelens"),
    "timelens2_vlmevalkit_charades": (f"{LMMS_TIMELENS_PRE}{CAPTION}{LMMS_TIMELENS_POST}", True, 512, "exact",
                                      "timelens2_vlmevalkit"),
    "timelens2_vlmevalkit_activitynet": (f"{LMMS_TIMELENS_PRE}{CAPTION}{LMMS_TIMELENS_POST}", True, 512, "exact",
                                         "timelens2_vlmevalkit"),
    "timelens2_vlmevalkit_qvhighlights": (f"{LMMS_TIMELENS_PRE}{CAPTION}{LMMS_TIMELENS_POST}", True, 512, "exact",
                                          "timelens2_vlmevalkit"),
    "timezero_charades_sta": (TIMEZERO_GROUND.replace("[EVENT]", CAPTION), False, 2048, "qwen_vl_utils", "timezero"),
    "time_r1_charades_sta": (TIME_R1_R1.format(CAPTION), False, 1024, "qwen_vl_utils", "time_r1"),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_preset_prompt_budget_and_scoring_are_the_evaluators(name):
    text, video_first, max_new_tokens, sampler, scoring = EXPECTED[name]
    bench = load_benchmark(EVALUATION / f"{name}.yaml")
    template = bench.protocol.prompt_template
    assert instruction(CAPTION, template) == text  # character for character, "seonds" included
    assert get_template(template).video_first is video_first
    assert (bench.max_new_tokens, bench.protocol.video.sampler, bench.scorings) == (max_new_tokens, sampler, (scoring,))


def test_extremewhenbench_reports_its_own_metric():
    assert load_benchmark(EVALUATION / "extremewhenbench.yaml").scorings == ("lmms_extremewhenbench",)
    bench = load_benchmark(EVALUATION / "lmms_eval_extremewhenbench.yaml")
    # lmms-eval @75571cf tasks/extremewhenbench/utils.py DEFAULT_PROMPT.format(dur=3725.5, question=...)
    default_prompt = (
        "[Video Temporal Grounding]\n"
        "You are watching a {dur:.0f}-second long video.\n"
        "Please find the moment described by the following question, "
        "determining its starting and ending times. The format should be: "
        "'The event happens in the start time - end time'. "
        "For example, The event 'person turn a light on' happens in the "
        "24.3 - 30.4 seconds. "
        'Now I will give you the question: "{question}"\n'
        "Please return its start time and end time."
    )
    assert instruction("When does he leave?", bench.protocol.prompt_template, duration=3725.5) == \
        default_prompt.format(dur=3725.5, question="When does he leave?")
    assert (bench.max_new_tokens, bench.protocol.video.sampler, bench.scorings) == (
        50, "lmms_eval_qwen2_5_vl", ("lmms_extremewhenbench",))


def test_lmms_eval_indices():
    """lmms-eval's Qwen2.5-VL backend: unique(linspace(0, T − 1, 32, dtype=int)) plus the last frame."""
    from grounding_rl.data.video import lmms_eval_indices

    assert lmms_eval_indices(60).tolist() == np.unique(np.linspace(0, 59, 32, dtype=int)).tolist()
    assert lmms_eval_indices(60).tolist()[:4] == [0, 1, 3, 5] and lmms_eval_indices(60)[-1] == 59
    assert len(lmms_eval_indices(70)) == 32 and lmms_eval_indices(10).tolist() == list(range(10))


def test_lmms_eval_sampler_keeps_32_of_qwen_vl_utils_frames(videos_dir):
    """The frames qwen-vl-utils gives (sizes from all of them, the budget respected), 32 kept, 2 fps claimed."""
    from grounding_rl.data.video import VideoSettings, lmms_eval_indices, sample_frames

    settings = dict(fps=2.0, min_pixels=28 * 28 * 4, max_pixels=28 * 28 * 8)
    full = sample_frames(videos_dir / "charades_OHOFG.mp4", VideoSettings(sampler="qwen_vl_utils", **settings))
    cut = sample_frames(videos_dir / "charades_OHOFG.mp4", VideoSettings(sampler="lmms_eval_qwen2_5_vl", **settings))
    keep = lmms_eval_indices(full.num_frames)
    assert full.num_frames == 70 and cut.num_frames == 32
    assert cut.frame_indices == [full.frame_indices[i] for i in keep] and np.array_equal(cut.frames, full.frames[keep])
    assert cut.sampled_fps == 2.0 and abs(full.sampled_fps - 2.0) > 1e-3  # what the processor assumes, not the truth
    # the long-video settings hold: a token budget shrinks the frames before the cut, as qwen-vl-utils sizes them
    budget = sample_frames(videos_dir / "charades_OHOFG.mp4",
                           VideoSettings(sampler="lmms_eval_qwen2_5_vl", total_tokens=70, min_tokens=1, fps=2.0))
    assert budget.num_frames == 32 and budget.frames.shape[1] * budget.frames.shape[2] <= 70 * 28 * 28 * 2 / 70


def test_print_prompt_and_dry_run_of_the_lmms_eval_preset(tiny_model_dir, videos_dir, tmp_path, capsys):
    """``--print-prompt`` shows lmms-eval's Charades text after the video; a tiny-model run of the preset's protocol
    (on the shipped clips) writes the lmms_charades_sta scoring beside standard, with 32 frames and 50 new tokens."""
    from grounding_rl.cli import infer as infer_cli
    from grounding_rl.eval.evaluate import EvalRequest, evaluate
    from grounding_rl.eval.settings import PreprocessingOverrides

    small = ["--min-pixels", str(28 * 28 * 4), "--max-pixels", str(28 * 28 * 4)]
    assert infer_cli.main(["--model", str(tiny_model_dir), "--video", str(videos_dir / "charades_OHOFG.mp4"),
                           "--query", CAPTION, "--print-prompt", "--prompt-template", "lmms_charades_sta",
                           "--video-sampler", "lmms_eval_qwen2_5_vl", "--max-new-tokens", "2", *small]) == 0
    prompt = capsys.readouterr().out
    expected = EXPECTED["lmms_eval_charades_sta"][0]
    assert f"<|vision_end|>{expected}<|im_end|>" in prompt
    assert re.findall(r"<\|video_pad\|>×(\d+)", prompt) == ["32"]  # 32 frames: 16 temporal patches x 2 tokens

    spec = yaml.safe_load((EVALUATION / "lmms_eval_charades_sta.yaml").read_text())
    spec.update(name="clips", format="jsonl", annotations=str(videos_dir / "annotations.jsonl"), durations=None,
                expected_queries=None, video_root=str(videos_dir))
    (tmp_path / "clips.yaml").write_text(yaml.safe_dump(spec))
    out = tmp_path / "out"
    data = tmp_path / "data.jsonl"
    data.write_text((videos_dir / "annotations.jsonl").read_text())
    metrics = evaluate(EvalRequest(model=str(tiny_model_dir), data=str(data), out=str(out), limit=2, num_workers=0,
                                   video_root=str(videos_dir), benchmark=str(tmp_path / "clips.yaml"),
                                   overrides=PreprocessingOverrides(min_pixels=28 * 28 * 4, max_pixels=28 * 28 * 4)))
    assert metrics["sampling"]["max_new_tokens"] == 50 and metrics["sampling"]["prompt_template"] == "lmms_charades_sta"
    assert metrics["sampling"]["video"]["sampler"] == "lmms_eval_qwen2_5_vl"
    assert list(metrics["by_scoring"]) == ["standard", "clamped", "lmms_charades_sta"]
    assert metrics["by_scoring"]["lmms_charades_sta"]["n"] == 2
    rows = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert [r["sampling"]["frames"] for r in rows] == [32, 32]
