"""The interval-set rewards as registered GRPO reward functions, the format reward of the set templates, and
TimeLens2's reward spec strings in the GRPO config."""
import json
from pathlib import Path

import pytest

from grounding_rl.reward.rewards import format_reward, get_reward_funcs, iou_reward, reward_name
from grounding_rl.reward.set_rewards import translate_timelens2_spec
from tests.test_intervals import FIXTURE


def _reward(name):
    (func,) = get_reward_funcs([name])
    return func


def test_set_rewards_score_parsed_sets_against_the_spans_column():
    columns = dict(start=[1.0] * 4, end=[7.0] * 4, duration=[20.0] * 4, spans=[[[1, 3], [5, 7]]] * 4)
    completions = ["[[1, 3], [5, 7]]", "<answer>[[0, 4]]</answer>", "nothing here", "[[3, 1]]"]
    assert _reward("set_iou")(completions, **columns) == pytest.approx([1.0, 2 / 6, 0.0, 0.0])
    assert _reward("twass1")(completions, **columns)[:2] == pytest.approx([1.0, 0.6065306597], abs=1e-9)
    assert _reward("parse_penalty")(completions, **columns) == [0.0, 0.0, -1.0, -1.0]   # a reversed pair: unusable
    assert _reward("length_ratio_penalty")(completions, **columns) == [0.0, 0.0, 0.0, 0.0]
    assert _reward("ngiou")(completions, **columns)[:2] == pytest.approx([1.0, 0.375])
    assert reward_name(_reward("twass1"), "twass1") == "twass1" and reward_name(_reward("set_iou")) == "set_iou"


def test_registered_rewards_agree_with_timelens2_on_the_fixture():
    for spec in ("tiou", "twass", "twass1", "r2twass", "ngiou", "length_ratio_penalty", "parse_penalty"):
        name = "set_iou" if spec == "tiou" else spec
        cases = FIXTURE["cases"]
        texts = ["<answer>[" + ", ".join(f"[{s!r}, {e!r}]" for s, e in c["pred"]) + "]</answer>" for c in cases]
        got = _reward(name)(texts, start=[0.0] * len(cases), end=[1.0] * len(cases),
                            duration=[c["duration"] for c in cases], spans=[c["gt"] for c in cases])
        assert max(abs(g - c["expected"][spec]) for g, c in zip(got, cases)) < 1e-6, spec


def test_single_span_set_iou_equals_iou_exactly_inside_the_video():
    completions = ["<answer>15.30 to 18.50</answer>", "<answer>-3 to 18</answer>", "<answer>14 to 99</answer>",
                   "<answer>10.00 to 12.00</answer>", "no answer", "<answer>19 to 18</answer>"]
    columns = dict(start=[15.0] * 6, end=[18.0] * 6, duration=[30.0] * 6)
    ours, single = _reward("set_iou")(completions, **columns), iou_reward(completions, **columns)
    inside = [0, 1, 3, 4, 5]  # "-3 to 18" reads as nothing (no negative times): 0 in both
    assert [ours[i] for i in inside] == [single[i] for i in inside]
    # past the video, set_iou scores the answer as written (TimeLens2), iou clamps it into [0, 30] first
    assert ours[2] == pytest.approx(3 / 85) and single[2] == pytest.approx(3 / 16)


def test_format_reward_is_strict_per_set_template():
    timelens2 = ["[[0, 3.5], [10, 12]]", "<answer>[[0, 3.5]]</answer>", "<think>x</think>[[0, 3.5]]",
                 "Spans: [[0, 3.5]]", "<answer>0 to 3.5</answer>", "[[0, 3.5]] [[1, 2]]"]
    assert format_reward(timelens2, prompt_template="timelens2") == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0]
    multi = ["<think>a</think><answer>[[1.00, 2.00], [3, 4]]</answer>", "<answer>[[1, 2]]</answer>",
             "<think>a</think><answer>1 to 2</answer>"]
    assert format_reward(multi, prompt_template="default_multi") == [1.0, 0.0, 0.0]


def test_timelens2_spec_strings_translate():
    assert translate_timelens2_spec("tiou,twass1:0.5, parse_penalty:0.2") == (
        ["set_iou", "twass1", "parse_penalty"], [1.0, 0.5, 0.2])
    with pytest.raises(ValueError, match="'format:0.2' has no counterpart"):
        translate_timelens2_spec("tiou,format:0.2")


def test_grpo_config_translates_spec_and_refuses_tiou_with_timelens2(tmp_path):
    from grounding_rl.update.config import GroundingGRPOConfig

    common = dict(output_dir=str(tmp_path), use_cpu=True, per_device_train_batch_size=4, report_to=[])
    args = GroundingGRPOConfig(**common, reward_funcs=["tiou,twass1:0.5"], prompt_template="timelens2")
    assert (args.reward_funcs, args.reward_weights) == (["set_iou", "twass1"], [1.0, 0.5])
    with pytest.raises(ValueError, match="'tiou' is Time-R1's .*'set_iou'"):
        GroundingGRPOConfig(**common, reward_funcs=["tiou", "format"], prompt_template="timelens2")
    assert GroundingGRPOConfig(**common, reward_funcs=["tiou"]).reward_funcs == ["tiou"]  # ours, default template


@pytest.mark.parametrize("text, spans", [
    ("<answer>[[0, 3.5], [10, 12]]</answer>", [(0.0, 3.5), (10.0, 12.0)]),
    ("The spans are [[0,3.5],[10,12]].", [(0.0, 3.5), (10.0, 12.0)]),
    ("<think>maybe [[9, 9]]</think><answer>[[1.5, 12]]</answer>", [(1.5, 12.0)]),
    ("<answer>0 to 3.5 and 10 to 12</answer>", [(0.0, 3.5), (10.0, 12.0)]),
    ("from 0 to 3.5 s, and again from 10 to 12 s", [(0.0, 3.5), (10.0, 12.0)]),
    ("0 - 3.5, 10 - 12 seconds", [(0.0, 3.5), (10.0, 12.0)]),
    ("<answer>12.54 to 17.83</answer>", [(12.54, 17.83)]),        # today's single-span forms
    ("between 3 and 7", [(3.0, 7.0)]),
    ("[[1, 2], [1, 2]]", [(1.0, 2.0), (1.0, 2.0)]),               # repeats kept (qvhighlights counts them)
    ("<answer>[[5, 3]]</answer>", [(5.0, 3.0)]),                  # as written: the reward policy scores it 0
    ("[[1,2]] and [[3,4]]", None),                                # two arrays: ambiguous
    ("[[1,2], [3,4]] 5", None),                                   # a number beside the array
    ("[[1,2]] 5", [(1.0, 2.0)]),                                  # one span: as the single-span parser reads it
    ("1 to 2 and 3", None), ("1 to 2 to 3 to 4", None), ("3 and 5 and 7 and 9", None), ("12,5 to 17,8", None),
    ("start 3 end 4, 5 to 6", None), ("[[1, 2], [3, 4]", None), ("at 5 s", None), ("0 to 3 and 4 to 5 minutes", None),
])
def test_parse_spans(text, spans):
    from grounding_rl.prompts.parsing import parse_answer, parse_spans

    assert parse_spans(text) == spans
    single = parse_answer(text)
    if single is not None:               # a single-span answer reads the same as before
        assert parse_spans(text) == [single]


def test_parse_spans_is_linear():
    import time

    from grounding_rl.prompts.parsing import parse_spans

    def seconds(text):
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            parse_spans(text)
            best = min(best, time.perf_counter() - t0)
        return best

    for unit in ("[[", "[[1, 2], ", "1 to ", "[[1,2]] and "):
        ratio = seconds(unit * 20000) / max(seconds(unit * 2000), 1e-6)
        assert ratio < 40, (unit, ratio)   # 10× the text: ~10× the time (quadratic would be ~100×)


def test_grpo_scores_set_rewards_against_the_spans_column(tmp_path, tiny_model_dir, videos_dir):
    from conftest import POOL

    from grounding_rl.data.dataset import GroundingDataset
    from tests.test_trainer import make_trainer

    seen = {}

    def capture(completions, spans=None, **columns):
        seen["spans"] = spans
        return [0.0] * len(completions)

    dataset = GroundingDataset([{"video": str(videos_dir / POOL), "query": "the main action", "start": 1.0, "end": 4.0,
                                 "duration": 6.5, "qid": "a", "spans": [[1.0, 2.0], [3.0, 4.0]]}])
    trainer = make_trainer(tmp_path, tiny_model_dir, dataset, reward_funcs=["set_iou", "twass1", "parse_penalty",
                                                                           capture], prompt_template="timelens2")
    assert trainer.reward_func_names[:3] == ["set_iou", "twass1", "parse_penalty"]
    trainer.generate_and_score(trainer.data_collator([trainer.train_dataset[0]] * 4))
    assert seen["spans"] == [[[1.0, 2.0], [3.0, 4.0]]] * 4
    penalty = trainer._metrics["rewards/parse_penalty/mean"][0]
    assert -1.0 <= penalty <= 0.0 and 0.0 <= trainer._metrics["rewards/set_iou/mean"][0] <= 1.0


EDGES = json.loads((Path(__file__).parent / "fixtures" / "timelens2_rewards_edges.json").read_text())


@pytest.mark.parametrize("spec", EDGES["specs"])
def test_rewards_equal_timelens2s_with_unclamped_predictions_and_the_annotated_windows(spec):
    """TimeLens2's values (its own code, fixture) where ours used to differ: predictions past the video's end (not
    clamped), overlapping and touching ground truth (the annotated windows, ``raw_spans``, beside the merged
    ``spans`` the dataset carries), repeated predicted windows."""
    from grounding_rl.data.samples import validate_spans

    name = "set_iou" if spec == "tiou" else spec
    cases = EDGES["cases"]
    texts = ["<answer>" + json.dumps(c["pred"]) + "</answer>" for c in cases]
    merged = [[list(s) for s in validate_spans(tuple(map(tuple, c["gt"])), c["duration"])] for c in cases]
    got = _reward(name)(texts, start=[m[0][0] for m in merged], end=[m[-1][1] for m in merged],
                        duration=[c["duration"] for c in cases], spans=merged, raw_spans=[c["gt"] for c in cases])
    for g, c in zip(got, cases):
        assert g == pytest.approx(c["expected"][spec], abs=1e-9), (spec, c["why"])
