"""The annotations' durations against the clips' (grounding_rl/data/durations.py): what ``eval`` and training probe up
front. The refusal's one line through the CLI is in tests/test_cli_errors.py (CASES, ``ms.jsonl``)."""
import pytest

from grounding_rl.data.durations import check_first_videos
from grounding_rl.data.samples import Sample
from grounding_rl.errors import UserError


def _sample(video, duration, qid):
    return Sample(video=str(video), query="q", start=1.0, end=2.0, duration=duration, qid=qid, source="jsonl")


def test_only_the_first_videos_are_probed_and_missing_ones_are_skipped(videos_dir, tmp_path):
    """A missing clip is skipped (its failure is counted where clips load); the third distinct video lies past
    ``max_videos`` 2, so its 1000-fold duration goes unseen; a gross one within them is refused, counted out of the
    queries compared (2: the missing clip's query is not one)."""
    drill, pool = videos_dir / "mmaction2_basketball_drill.mp4", videos_dir / "mmaction2_pool_cleaning.mp4"
    samples = [_sample(tmp_path / "missing.mp4", 5.0, "a"), _sample(drill, 10.0, "b"), _sample(pool, 10000.0, "c")]
    assert check_first_videos(samples, "f.jsonl", max_videos=2) == 1  # 10.0 s vs 10.01 s: small, counted
    with pytest.raises(UserError, match=r"^f\.jsonl: 1 of 2 durations differ .* \(qid 'c': 10000 s, "
                                        r"mmaction2_pool_cleaning\.mp4 lasts 10\.00 s\): milliseconds or frames"):
        check_first_videos(samples, "f.jsonl", max_videos=3)
