"""TimeLens2's video-length filter of the training set (``min_video_duration`` / ``max_video_duration``): its
comparison (MCG-NJU/TimeLens2 @a5ce450 ``grpo/timelens/data/dataset.py`` ``_passes_filters``: dropped when
``duration < min_video_len`` or ``duration > max_video_len``, so both bounds are kept), applied where the training
set is read, counted, logged and saved."""
import json
import logging

import pytest

from grounding_rl.cli.common import GroundingScriptArguments, load_dataset
from grounding_rl.data.dataset import filter_by_duration, within_duration
from grounding_rl.errors import UserError
from grounding_rl.prompts.preprocessing import GroundingConfig

DURATIONS = (2.9, 3.0, 3600.0, 3600.5)


def _rows(durations=DURATIONS):
    return [{"video": f"v{i}.mp4", "query": "a person sits down", "start": 0.5, "end": 2.0, "duration": d,
             "qid": f"q{i}"} for i, d in enumerate(durations)]


def test_bounds_are_inclusive_as_timelens2s_comparison():
    # TimeLens2's recipes: MIN_VIDEO_LEN 3, MAX_VIDEO_LEN 3600 (grpo/scripts/train.sh, train_grpo_{4b,8b}.sh)
    assert [within_duration(d, 3.0, 3600.0) for d in DURATIONS] == [False, True, True, False]
    assert [within_duration(d, None, 3600.0) for d in DURATIONS] == [True, True, True, False]
    assert [within_duration(d, 3.0, None) for d in DURATIONS] == [False, True, True, True]
    assert all(within_duration(d, None, None) for d in DURATIONS)
    kept, dropped = filter_by_duration(_rows(), 3.0, 3600.0)
    assert [s["qid"] for s in kept] == ["q1", "q2"] and dropped == 2


def test_load_dataset_drops_counts_and_logs(tmp_path, caplog):
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in _rows()))
    args = GroundingScriptArguments(train_file=str(path), min_video_duration=3.0, max_video_duration=3600.0,
                                    max_missing_fraction=1.0)  # the videos are not there: substitutes are counted
    with caplog.at_level(logging.INFO, logger="grounding_rl.cli"):
        dataset = load_dataset(args)
    assert [s["qid"] for s in dataset.samples] == ["q1", "q2"]
    assert [s["duration"] for s in dataset.samples] == [3.0, 3600.0]
    assert dataset.duration_filter == {"min_video_duration": 3.0, "max_video_duration": 3600.0, "samples": 4,
                                       "dropped": 2}
    assert "dropped 2 of 4 training samples whose video duration lies outside [3, 3600] s" in caplog.text
    # applied before max_train_samples: the first kept sample, not the first line
    args.max_train_samples = 1
    assert [s["qid"] for s in load_dataset(args).samples] == ["q1"]
    # off by default: nothing dropped, nothing recorded
    plain = load_dataset(GroundingScriptArguments(train_file=str(path), max_missing_fraction=1.0))
    assert len(plain) == 4 and plain.duration_filter is None
    # bounds that keep nothing are a user's mistake, not an empty run
    with pytest.raises(UserError, match=r"all 4 samples have a video duration outside \[4000, ∞\] s"):
        load_dataset(GroundingScriptArguments(train_file=str(path), min_video_duration=4000.0,
                                              max_missing_fraction=1.0))


def test_grounding_config_keeps_the_filter_record():
    record = {"min_video_duration": 3.0, "max_video_duration": 3600.0, "samples": 4, "dropped": 2}
    config = GroundingConfig(duration_filter=record)
    assert GroundingConfig.from_dict(json.loads(json.dumps(config.to_dict()))).duration_filter == record
    assert GroundingConfig.from_dict({}).duration_filter is None


@pytest.mark.parametrize("yaml_name", ["qwen3_vl_8b_timelens2.yaml", "qwen3_vl_4b_timelens2.yaml"])
def test_timelens2_recipes_set_the_filter(yaml_name):
    from grounding_rl.paths import REPO_ROOT
    from grounding_rl.yaml_files import load_yaml

    config = load_yaml(REPO_ROOT / "configs" / yaml_name)
    assert (config["min_video_duration"], config["max_video_duration"]) == (3.0, 3600.0)
