"""Golden answers of every answering mode: what ``eval`` and ``infer`` answer in one pass, with
``--zoom`` and with the crop tool (``--max-turns``) on the noisy tiny model of each family (HF engine), and the
SHA-256 of the weights after two CPU steps of the two training recipes that run the turn loop (two-pass zoom, crop
tool). tests/test_golden_answers.py recomputes them and compares with tests/fixtures/golden/.

Run as a script to (re)write the golden files, at the commit whose answers are the reference:

    PYTHONPATH=. HF_HUB_OFFLINE=1 python tests/golden_answers.py

The tiny models are built as the tests build them (``grounding_rl.dev.tiny.build_tiny_model``, seed 0, then
:func:`conftest.make_noisy_model`): their greedy answers depend on the clip and the query. ``video`` is written
relative to the clips' folder. Everything runs on one CPU thread (:func:`one_thread`): a float sum's order follows the
thread count, which other test modules change (``torch.set_num_threads(1)`` at import) and machines differ in; the
trained weights would follow it.
"""
from __future__ import annotations

import contextlib
import hashlib
import io
import json
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
GOLDEN = HERE / "fixtures" / "golden"
FAMILIES = ("qwen2_5_vl", "qwen3_vl")
MODES = {"single": [], "zoom": ["--zoom"], "crop_tool": ["--max-turns", "2"]}
FAST = ["--fps", "1", "--max-pixels", str(28 * 28 * 16), "--min-pixels", str(28 * 28 * 4), "--max-new-tokens", "24"]
# two clips, four queries: lines of ../shared/data/videos/annotations.jsonl
LINES = (0, 3, 5, 6)
INFER_QUERIES = ("person sitting down in a chair.", "a person is eating some food.")
RECIPES = {"two_pass_zoom": dict(two_pass_zoom=True), "crop_tool": dict(max_tool_calling_iterations=1)}


@contextlib.contextmanager
def one_thread():
    """Torch on one intra-op thread within the block (the thread count before is restored)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def build_models(shared: Path, out: Path) -> dict[str, Path]:
    """``{family: folder}`` of the noisy tiny model of each family, built in ``out``."""
    sys.path.insert(0, str(HERE))
    from conftest import make_noisy_model

    from grounding_rl.dev.tiny import build_tiny_model

    models = shared / "models"
    tiny = {"qwen2_5_vl": build_tiny_model(out / "tiny25", tokenizer=models / "Qwen2.5-VL-7B-Instruct", seed=0),
            "qwen3_vl": build_tiny_model(out / "tiny3", like=models / "Qwen3-VL-8B-Instruct", seed=0)}
    return {family: make_noisy_model(path, out / f"noisy_{family}") for family, path in tiny.items()}


def eval_answers(model: Path, videos: Path, mode: str, out: Path) -> list[dict]:
    """``grounding-rl eval`` records of :data:`LINES` in ``mode`` (``video`` relative to ``videos``)."""
    from grounding_rl.cli import main as cli

    lines = (videos / "annotations.jsonl").read_text().splitlines()
    out.mkdir(parents=True, exist_ok=True)
    data = out / "data.jsonl"
    rows = [json.loads(lines[i]) for i in LINES]
    data.write_text("".join(json.dumps({**row, "video": str(videos / row["video"])}) + "\n" for row in rows))
    with contextlib.redirect_stdout(io.StringIO()), one_thread():
        rc = cli(["eval", "--model", str(model), "--data", str(data), "--out", str(out / "eval"), *FAST,
                  "--num-workers", "0", "--batch-size", "2", *MODES[mode]])
    assert rc == 0, f"eval {mode} exited {rc}"
    records = [json.loads(line) for line in (out / "eval" / "predictions.jsonl").read_text().splitlines()]
    return [{**r, "video": str(Path(r["video"]).relative_to(videos))} for r in records]


def infer_answers(model: Path, videos: Path, mode: str) -> list[dict]:
    """``grounding-rl infer --json`` results for :data:`INFER_QUERIES` on the Charades clip in ``mode``."""
    from grounding_rl.cli import infer as infer_cli

    command = ["--model", str(model), "--video", str(videos / "charades_OHOFG.mp4"), "--json", *FAST, *MODES[mode]]
    for query in INFER_QUERIES:
        command += ["--query", query]
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout), one_thread():
        rc = infer_cli.main(command)
    assert rc == 0, f"infer {mode} exited {rc}"
    return json.loads(stdout.getvalue())


def recipe_weights_sha256(model: Path, videos: Path, recipe: str, out: Path) -> str:
    """SHA-256 over the policy's state dict (names in order, raw bytes) after 2 GRPO steps on CPU with ``recipe``."""
    import torch

    sys.path.insert(0, str(HERE))
    from conftest import POOL, MAKEUP, clip_dataset, grpo_config, make_grpo_trainer

    config = grpo_config(out, max_steps=2, num_generations=2, learning_rate=1e-3, max_completion_length=16,
                         reward_funcs=["iou", "tests/conftest.py:varied_reward"], **RECIPES[recipe])
    with one_thread():
        trainer = make_grpo_trainer(model, config, clip_dataset(videos, names=(POOL, MAKEUP)),
                                    reward_funcs=config.reward_funcs)
        trainer.train()
    digest = hashlib.sha256()
    for name, tensor in trainer.accelerator.unwrap_model(trainer.model).state_dict().items():
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def golden_name(kind: str, family: str, mode: str) -> Path:
    return GOLDEN / f"{kind}_{family}_{mode}.jsonl"


def main() -> int:
    from grounding_rl.paths import shared_dir

    shared = shared_dir()
    assert shared is not None, "../shared is needed"
    videos = shared / "data" / "videos"
    GOLDEN.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        models = build_models(shared, tmp)
        weights = {}
        for family, model in models.items():
            for mode in MODES:
                records = eval_answers(model, videos, mode, tmp / f"eval_{family}_{mode}")
                golden_name("eval", family, mode).write_text("".join(json.dumps(r) + "\n" for r in records))
                results = infer_answers(model, videos, mode)
                golden_name("infer", family, mode).write_text("".join(json.dumps(r) + "\n" for r in results))
            for recipe in RECIPES:
                weights[f"{family}/{recipe}"] = recipe_weights_sha256(model, videos, recipe,
                                                                      tmp / f"train_{family}_{recipe}")
        (GOLDEN / "recipe_weights.json").write_text(json.dumps(weights, indent=1) + "\n")
    print(f"wrote {GOLDEN}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
