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


@pytest.fixture(scope="session")
def demo_dir(tmp_path_factory) -> Path:
    """Procedural demo clips (``grounding_rl.dev.demo.generate_demo``): 8 train and 4 test clips of seed 0, built once
    per session (tests that need fewer take the first N lines; clip i does not depend on how many are drawn)."""
    from grounding_rl.dev.demo import generate_demo

    out = tmp_path_factory.mktemp("demo")
    generate_demo(out, num_train=8, num_test=4, seed=0, progress=False)
    return out


def assert_linear_time(run, n: int, repeat: int = 3, bound: float = 3.0) -> float:
    """Time ``run(n)`` and ``run(2 * n)`` in this process's CPU seconds (``time.process_time``: the other test
    processes running beside it do not count, as they do in wall time; each the least of ``repeat`` calls) and assert
    t(2n) / t(n) < ``bound``: linear work gives 2, quadratic 4, a backtracking regex far more. A ratio within one run
    instead of a wall-clock bound, which a loaded machine can fail. Returns the ratio."""
    import time

    def least(size):
        best = float("inf")
        for _ in range(repeat):
            began = time.process_time()
            run(size)
            best = min(best, time.process_time() - began)
        return best

    single, double = least(n), least(2 * n)
    ratio = double / max(single, 1e-9)
    assert ratio < bound, f"t(2n) / t(n) = {double:.3f} s / {single:.3f} s = {ratio:.2f} (n = {n})"
    return ratio


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


# The one GRPO trainer factory of the tests: small pixel budgets (≤ 16 merged tokens per frame pair), 8-token
# completions, no saving; each test file passes what it needs on top (tests/test_trainer.py, test_resume.py,
# test_sharing.py, test_device.py, test_validation.py).
GRPO_TEST_SETTINGS = dict(use_cpu=True, per_device_train_batch_size=4, max_steps=1, max_completion_length=8,
                          report_to=[], save_strategy="no", seed=0, video_fps=1.0, video_min_pixels=3136,
                          video_max_pixels=28 * 28 * 16, dataloader_num_workers=0)


def grpo_config(output_dir, **overrides):
    """A ``GroundingGRPOConfig`` of :data:`GRPO_TEST_SETTINGS` writing to ``output_dir``, ``overrides`` on top."""
    from grounding_rl.update.config import GroundingGRPOConfig

    return GroundingGRPOConfig.build(**{**GRPO_TEST_SETTINGS, "output_dir": str(output_dir), **overrides})


def clip_dataset(videos_dir: Path, names=(POOL, MAKEUP)):
    """One query per shared clip of ``names`` (ground truth 1-4 s of a 6.5 s clip, qid the clip's name)."""
    from grounding_rl.data.dataset import GroundingDataset

    return GroundingDataset([{"video": str(videos_dir / name), "query": f"the main action in {name}", "start": 1.0,
                              "end": 4.0, "duration": 6.5, "qid": name} for name in names])


def make_grpo_trainer(model_dir: Path, config, dataset, reward_funcs=(varied_reward,), peft=None,
                      attn_implementation: str | None = None):
    """A ``GroundingGRPOTrainer`` on the model in ``model_dir`` (``config`` from :func:`grpo_config`); ``peft`` a
    ``peft.LoraConfig`` wraps the policy in an adapter drawn after ``torch.manual_seed(0)`` (the same adapter in
    every trainer of a test)."""
    import torch

    from grounding_rl.models.loading import load_policy, load_processor
    from grounding_rl.update.trainer import GroundingGRPOTrainer

    model = load_policy(str(model_dir), attn_implementation=attn_implementation)
    if peft is not None:
        from peft import get_peft_model

        torch.manual_seed(0)
        model = get_peft_model(model, peft)
    return GroundingGRPOTrainer(model, config, dataset, load_processor(str(model_dir)), reward_funcs=list(reward_funcs))


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


# ------------------------------------------------------------------------------------------------------- test tiers
# `bash scripts/test.sh` runs the fast tier (`--tier fast`), `bash scripts/test.sh --full` and plain `pytest` run every
# test (`--tier full`, what CI runs). A test's tier follows from what it uses, never from a hand tag on the test:
#   - full: it is marked slow (multi-process launches and end-to-end script runs: tests/test_multiprocess.py,
#     the scripts/*.sh runs, the installed package); or it uses a tiny model (a fixture of TINY_MODEL_FIXTURES, or any
#     fixture named *model_dir: test files' own variants such as noisy_model_dir, and the tiny Qwen3-VL, the second
#     family, in every form) and is not the smoke test of a seam below.
#   - fast: everything else (the model-free tests, including the processor-only ones of both families) plus
#     SEAM_SMOKE_TESTS: one test per seam of the training and evaluation path, on the tiny Qwen2.5-VL, so that a
#     contributor's run still crosses every seam once.
# The session ends with one line saying how many tests the fast tier left to the full one.
TINY_MODEL_FIXTURES = {"tiny_model_dir", "bpe_tiny_model_dir", "noisy_tiny_model_dir", "family_model_dir",
                       "tiny_qwen3_model_dir"}
# seam -> the one test (node id under tests/) that crosses it in the fast tier
SEAM_SMOKE_TESTS = {
    "update sign": "test_trainer.py::test_sign_of_the_update_follows_the_advantage[qwen2_5_vl]",
    "position ids": "test_trainer.py::test_position_ids_match_in_generation_policy_and_reference[qwen2_5_vl-1.0]",
    "encode-once": "test_sharing.py::test_generation_is_identical_and_encodes_each_clip_once[qwen2_5_vl]",
    "prefix sharing": "test_sharing.py::test_prefix_sharing_gives_the_per_row_logps_and_positions[qwen2_5_vl-1.0-sdpa]",
    "eval files": "test_eval.py::test_eval_writes_all_files_with_the_right_keys[qwen2_5_vl]",
    "one SFT step": "test_resume.py::test_resume_refuses_another_runs_checkpoint",
    "resume": "test_resume.py::test_grpo_resumed_at_a_checkpoint_ends_bit_identical[full-mid-epoch]",
    "vLLM prompt collapse":
        "test_vllm_engine.py::test_vllm_prompt_is_the_unexpanded_prompt_of_either_family[qwen2_5_vl-released]",
    "infer": "test_infer.py::test_infer_real_tiny_model_json_and_plot",
}


def pytest_addoption(parser):
    parser.addoption("--tier", choices=["fast", "full"], default="full",
                     help="fast: model-free tests plus one smoke test per seam on one family (bash scripts/test.sh); "
                          "full: every test (bash scripts/test.sh --full, CI; the default)")


def full_tier_reason(item) -> str | None:
    """Why ``item`` belongs to the full tier only (None: it runs in the fast tier)."""
    if item.get_closest_marker("slow") is not None:
        return "slow"
    fixtures = set(getattr(item, "fixturenames", ()))
    uses_model = bool(fixtures & TINY_MODEL_FIXTURES) or any(name.endswith("model_dir") for name in fixtures)
    if uses_model and item.nodeid.removeprefix("tests/") not in SEAM_SMOKE_TESTS.values():
        return "tiny model"
    return None


def pytest_collection_modifyitems(config, items):
    if config.getoption("--tier") != "fast":
        return
    kept, full = [], []
    for item in items:
        (full if full_tier_reason(item) else kept).append(item)
    if full:
        config.hook.pytest_deselected(items=full)
        items[:] = kept
    config._full_tier_deselected = len(full)
    kept_ids = {item.nodeid.removeprefix("tests/") for item in kept}
    files = {item.nodeid.removeprefix("tests/").split("::")[0] for item in items + full}
    config._seams_not_collected = [seam for seam, test in SEAM_SMOKE_TESTS.items()
                                   if test.split("::")[0] in files and test not in kept_ids]


def pytest_terminal_summary(terminalreporter, config):
    count = getattr(config, "_full_tier_deselected", None)
    if count is not None:
        missing = config._seams_not_collected
        seams = (f"; no smoke test collected for: {', '.join(missing)} (a selection within its file, or a renamed "
                 "test: see SEAM_SMOKE_TESTS in tests/conftest.py)" if missing else "")
        terminalreporter.write_line(f"fast tier: {count} tests deselected as full-tier "
                                    f"(bash scripts/test.sh --full runs every test){seams}")
