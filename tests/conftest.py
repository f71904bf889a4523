"""Shared fixtures: the real data folder (skip outside CI when absent, fail in CI) and offline settings."""
import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from grounding_rl.paths import shared_dir  # noqa: E402


def _require_shared() -> Path:
    path = shared_dir()
    if path is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("../shared (or $GROUNDING_RL_SHARED) is missing in CI")
        pytest.skip("../shared is not available: set GROUNDING_RL_SHARED")
    return path


@pytest.fixture(scope="session")
def shared() -> Path:
    """Root of ../shared."""
    return _require_shared()


@pytest.fixture(scope="session")
def videos_dir(shared) -> Path:
    """../shared/data/videos: six real clips and annotations.jsonl."""
    return shared / "data" / "videos"


@pytest.fixture(scope="session")
def benchmarks_dir(shared) -> Path:
    """../shared/data/benchmarks: public annotation files."""
    return shared / "data" / "benchmarks"


@pytest.fixture(scope="session")
def qwen_processor_dir(shared) -> Path:
    """Real Qwen2.5-VL-7B-Instruct tokenizer/processor files (no weights)."""
    return shared / "models" / "Qwen2.5-VL-7B-Instruct"


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, qwen_processor_dir) -> Path:
    """A random-weight tiny Qwen2.5-VL with the real Qwen tokenizer and processor settings (built once per session)."""
    from grounding_rl.dev.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny_model"), tokenizer=qwen_processor_dir, seed=0)


@pytest.fixture(scope="session")
def bpe_tiny_model_dir(tmp_path_factory) -> Path:
    """A random-weight tiny Qwen2.5-VL with the locally trained BPE tokenizer (the demo's model; built once)."""
    from grounding_rl.dev.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny_bpe"), tokenizer=None, seed=0)


# The shared clips the trainer tests use (../shared/README.md lists their quirks).
POOL = "mmaction2_pool_cleaning.mp4"  # 10.0 s, 30 fps
MAKEUP = "mmaction2_eye_makeup.avi"  # 6.56 s, mpeg4 ASP, first pts 0.04
OHOFG = "charades_OHOFG.mp4"  # 35.2 s, 9.53 fps


def varied_reward(completions, **columns):
    """A reward with spread inside every group (a random tiny model never earns IoU/format rewards, which would leave
    every advantage at 0). Loadable as ``tests/conftest.py:varied_reward`` in ``reward_funcs``."""
    return [float(sum(map(ord, c)) % 97) / 97.0 for c in completions]


def spread_for_some_clips(completions, qid, **columns):
    """:func:`varied_reward` for clips whose qid has an even character sum, a constant 0.5 for the others: groups
    with and without reward spread in one batch (for dynamic sampling). Loadable as
    ``tests/conftest.py:spread_for_some_clips``."""
    return [varied_reward([c])[0] if sum(map(ord, str(q))) % 2 == 0 else 0.5 for c, q in zip(completions, qid)]


def make_noisy_model(tiny_model_dir: Path, out: Path) -> Path:
    """Save into ``out`` the tiny model with its matrices re-drawn from N(0, 0.3): the greedy answers then depend on
    the clip and the query (the plain tiny model answers newlines to everything), so comparisons between runs have
    teeth."""
    import torch
    from transformers import AutoModelForImageTextToText, AutoProcessor

    model = AutoModelForImageTextToText.from_pretrained(tiny_model_dir)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in model.parameters():
            if param.ndim >= 2:
                param.normal_(0.0, 0.3, generator=generator)
    model.save_pretrained(out)
    AutoProcessor.from_pretrained(tiny_model_dir).save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def noisy_tiny_model_dir(tiny_model_dir, tmp_path_factory) -> Path:
    """The Qwen2.5-VL tiny model made noisy (:func:`make_noisy_model`)."""
    return make_noisy_model(tiny_model_dir, tmp_path_factory.mktemp("noisy_model"))


@pytest.fixture(scope="session")
def qwen3_processor_dir(shared) -> Path:
    """Real Qwen3-VL-8B-Instruct config, processor, tokenizer and chat template files (no weights)."""
    return shared / "models" / "Qwen3-VL-8B-Instruct"


@pytest.fixture(scope="session")
def tiny_qwen3_model_dir(tmp_path_factory, qwen3_processor_dir) -> Path:
    """A random-weight tiny Qwen3-VL (DeepStack kept) with the real Qwen3-VL processor (built once per session)."""
    from grounding_rl.dev.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny_qwen3"), like=qwen3_processor_dir, seed=0)


# Tiny models of each family, for tests parametrized over families (``family_model_dir``).
FAMILY_MODEL_FIXTURES = {"qwen2_5_vl": "tiny_model_dir", "qwen3_vl": "tiny_qwen3_model_dir"}


@pytest.fixture(params=sorted(FAMILY_MODEL_FIXTURES))
def family_model_dir(request) -> Path:
    """The tiny model of each family in turn (the test's id names the family)."""
    return request.getfixturevalue(FAMILY_MODEL_FIXTURES[request.param])
