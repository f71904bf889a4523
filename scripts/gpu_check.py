"""The prepared GPU check: absolute figures at real model sizes, one results JSON written after every stage.

    bash scripts/gpu_check.sh [--dry-run] [--out FILE]     (the shell wrapper installs the carried wheels first)

Stages, in order (a stage that fails is recorded with its error and the next one runs; a stage that would start
after ``--budget-s`` seconds is recorded as skipped, so a cut-off run still reports what it measured):

1. ``environment``: Python, torch, CUDA, GPU name and memory, package versions.
2. ``fits``: ``grounding-rl fits --json`` (one process each) for Qwen2.5-VL-7B (the TimeZero recipe, 8 GPUs),
   Qwen3-VL-8B (the same settings) and Qwen2.5-VL-3B (the Time-R1 recipe, 1 GPU), built on the ``meta`` device.
3. ``tests``: ``pytest tests/test_device.py`` with ``GROUNDING_RL_TEST_DEVICE=cuda`` (update sign, position ids,
   encode-once equivalence in fp32 and bf16, reference model).
4. ``grpo_step``: one GRPO step of :class:`grounding_rl.update.trainer.GroundingGRPOTrainer` at the real
   Qwen2.5-VL-3B shape (``../shared/models/Qwen2.5-VL-3B-Instruct/config.json``, random weights, bf16, SDPA, activation
   checkpointing), β 0.04 with a reference copy, TimeZero's video budget (fps 2, 3584·28·28 pixels, min 16·28·28) on
   ``mmaction2_pool_cleaning.mp4``, G = 4 and 8 completions of exactly 256 new tokens (``min_new_tokens``), with
   ``share_video_encoding`` on and off: one warm-up step per arm, then one timed step: HF ``generate`` tokens per
   second, rollout / loss forward+backward / AdamW step seconds, peak GPU memory (``torch.cuda.max_memory_allocated``).
5. ``check``: ``grounding-rl check``'s checks (a-e, :func:`stage_check`) on the grpo_step policy (3B shape, bf16,
   random weights; HF only: no vLLM on the GPU machine), within 90 s. Untested on a GPU so far.
6. ``eval``: greedy answers (:func:`grounding_rl.rollout.generation.generate_answers`, the ``eval`` path, 256 new
   tokens at most) for the 15 queries on the six shared clips, batches of 4 queries: queries per second.

``--dry-run`` runs the same stages on the CPU with tiny shapes: a tiny random model (fp32) with the real tokenizer,
3136-pixel frames, 8 new tokens, no warm-up steps, ``pytest --collect-only`` for the tests stage, the 3B recipe alone
for ``fits`` and 4 queries for ``eval`` (about a minute on 2 busy cores, most of it imports).
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
CLIP = "mmaction2_pool_cleaning.mp4"
TIMEZERO_VIDEO = dict(video_fps=2.0, video_total_pixels=3584 * 28 * 28, video_min_pixels=16 * 28 * 28)
DRY_VIDEO = dict(video_fps=1.0, video_min_pixels=3136, video_max_pixels=3136)
BETA = 0.04
PACKAGES = ("torch", "torchvision", "transformers", "trl", "peft", "accelerate", "deepspeed", "datasets", "decord",
            "qwen-vl-utils", "numpy")


class Check:
    """Settings of one run and the results JSON it writes after each stage."""

    def __init__(self, out: Path, dry_run: bool, budget_s: float):
        from grounding_rl.paths import shared_dir

        self.out, self.dry_run, self.budget_s = out, dry_run, budget_s
        self.start = time.perf_counter()
        self.shared = shared_dir()
        if self.shared is None:
            raise SystemExit("gpu_check: no ../shared (set GROUNDING_RL_SHARED; scripts/fetch_gpu_wheels.sh copies "
                             "what the check needs into .gpu/shared)")
        self.device = torch.device("cpu" if dry_run else "cuda")
        self.new_tokens = 8 if dry_run else 256
        self.results = {"dry_run": dry_run, "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "stages": {}}
        self.workdir = Path(tempfile.mkdtemp(prefix="gpu_check_"))
        self._model_dir = None

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def write(self) -> None:
        self.results["elapsed_s"] = round(self.elapsed(), 1)
        self.out.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.out.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.results, indent=1))
        tmp.replace(self.out)

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()

    # ------------------------------------------------------------------------------------------ the model
    def processor_dir(self) -> Path:
        return self.shared / "models" / "Qwen2.5-VL-7B-Instruct"  # the 3B's tokenizer and processor are the same

    def model_dir(self) -> Path:
        """Dry run: a tiny random model saved with the real tokenizer. GPU: the 3B config and processor (the weights
        are made in :meth:`policy`)."""
        if self._model_dir is None:
            if self.dry_run:
                from grounding_rl.dev.tiny import build_tiny_model

                self._model_dir = build_tiny_model(self.workdir / "tiny", tokenizer=self.processor_dir(), seed=0)
            else:
                self._model_dir = self.shared / "models" / "Qwen2.5-VL-3B-Instruct"
        return self._model_dir

    def policy(self):
        """The policy: the tiny model in fp32 on CPU, or the 3B shape with random weights, bf16, SDPA, on the GPU."""
        from transformers import AutoConfig, AutoModelForImageTextToText, GenerationConfig

        from grounding_rl.models.loading import load_policy

        if self.dry_run:
            return load_policy(str(self.model_dir()))
        config = AutoConfig.from_pretrained(self.model_dir())
        torch.manual_seed(0)
        with torch.device(self.device):
            model = AutoModelForImageTextToText.from_config(config, dtype=torch.bfloat16, attn_implementation="sdpa")
        model.generation_config = GenerationConfig.from_pretrained(self.model_dir())
        return model


# ---------------------------------------------------------------------------------------------------- stages
def stage_environment(check: Check) -> dict:
    from importlib.metadata import PackageNotFoundError, version

    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = version(name)
        except PackageNotFoundError:
            versions[name] = None
    info = {"python": platform.python_version(), "machine": platform.machine(), "cpus": os.cpu_count(),
            "versions": versions, "cuda_available": torch.cuda.is_available(), "torch_cuda": torch.version.cuda}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info.update(gpu=props.name, gpu_memory_gib=round(props.total_memory / 2**30, 1),
                    capability=f"{props.major}.{props.minor}", bf16=torch.cuda.is_bf16_supported())
    elif not check.dry_run:
        raise RuntimeError("no CUDA device (run with --dry-run on a machine without a GPU)")
    return info


def stage_fits(check: Check) -> dict:
    """``grounding-rl fits --json`` per case, each in its own process: parsing a recipe builds TrainingArguments with
    ``use_cpu``, whose accelerate state is a per-process singleton that the CUDA stages must not inherit."""
    cases = [("qwen2_5_vl_3b_charades_time_r1.yaml", None, 1)]
    if not check.dry_run:
        cases = [("qwen2_5_vl_7b_charades_timezero.yaml", None, 8),
                 ("qwen2_5_vl_7b_charades_timezero.yaml", "Qwen/Qwen3-VL-8B-Instruct", 8)] + cases
    out = {}
    env = {**os.environ, "GROUNDING_RL_SHARED": str(check.shared)}
    for recipe, model, gpus in cases:
        cmd = [sys.executable, "-m", "grounding_rl.cli", "fits", f"configs/{recipe}", "--gpus", str(gpus),
               "--gpu-memory", "80", "--json"] + (["--model", model] if model else [])
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
        if proc.returncode:
            raise RuntimeError(f"{' '.join(cmd[2:])}: exit {proc.returncode}: {proc.stderr[-2000:]}")
        report = json.loads(proc.stdout.strip().splitlines()[-1])
        out[f"{report['model'].split('/')[-1]} ({recipe}, {gpus} GPUs)"] = {
            "total_params": report["shape"]["total_params"], "trainable_params": report["shape"]["trainable_params"],
            "sequence_tokens": report["workload"]["sequence_tokens"],
            "per_gpu_gib": {row["name"]: round(row["bytes"]["total"] / 2**30, 2) for row in report["strategies"]},
            "model_states_gib": {row["name"]: round(row["bytes"]["model_states"] / 2**30, 2)
                                 for row in report["strategies"]}}
    return out


def stage_tests(check: Check) -> dict:
    env = {**os.environ, "GROUNDING_RL_TEST_DEVICE": "cpu" if check.dry_run else "cuda",
           "GROUNDING_RL_SHARED": str(check.shared)}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_device.py"]
    if check.dry_run:
        cmd.append("--collect-only")
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=150)
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    summary = lines[-1] if lines else ""
    counts = {key: int(n) for n, key in re.findall(r"(\d+) (passed|failed|error|errors|skipped|tests? collected)",
                                                    summary)}
    result = {"returncode": proc.returncode, "summary": summary, "counts": counts}
    if proc.returncode:
        result["output_tail"] = (proc.stdout + proc.stderr)[-4000:]
        raise StageError(f"pytest exit {proc.returncode}: {summary}", result)
    return result


def _trainer(check: Check, model, ref_model, group: int):
    from grounding_rl.data.dataset import GroundingDataset
    from grounding_rl.models.loading import load_processor
    from grounding_rl.update.config import GroundingGRPOConfig
    from grounding_rl.update.trainer import GroundingGRPOTrainer

    video = DRY_VIDEO if check.dry_run else TIMEZERO_VIDEO
    args = GroundingGRPOConfig(
        output_dir=str(check.workdir / f"grpo{group}"), use_cpu=check.dry_run, bf16=not check.dry_run,
        per_device_train_batch_size=group, num_generations=group, max_steps=1, learning_rate=1e-6,
        max_completion_length=check.new_tokens, beta=BETA, report_to=[], save_strategy="no", seed=0,
        dataloader_num_workers=0, max_prompt_length=None, activation_checkpointing=True, prompt_template="timezero",
        **video)
    dataset = GroundingDataset([{"video": str(check.shared / "data" / "videos" / CLIP),
                                 "query": "a person cleans the pool", "start": 1.0, "end": 4.0, "duration": 10.0,
                                 "qid": "gpu_check"}])
    processor = load_processor(str(check.model_dir() if check.dry_run else check.processor_dir()))
    trainer = GroundingGRPOTrainer(model, args, dataset, processor, reward_funcs=[_varied_reward],
                                   ref_model=ref_model)
    trainer.model.generation_config.min_new_tokens = check.new_tokens  # every row decodes exactly new_tokens
    return trainer


def _varied_reward(completions, **columns):
    return [float(sum(map(ord, c)) % 97) / 97.0 for c in completions]


def _timed_step(check: Check, trainer, optimizer, items, share: bool) -> dict:
    """One GRPO step: rollout (generation, rewards, π_ref), loss forward + backward, AdamW step; seconds and peak."""
    trainer.args.share_video_encoding = share
    timing = {"generate": 0.0}
    engine = trainer.rollout_engine
    original = engine.generate

    def generate(*args, **kwargs):
        check.sync()
        start = time.perf_counter()
        out = original(*args, **kwargs)
        check.sync()
        timing["generate"] += time.perf_counter() - start
        return out

    engine.generate = generate
    if check.device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    torch.manual_seed(0)
    check.sync()
    start = time.perf_counter()
    batch = trainer.generate_and_score(items)
    check.sync()
    rollout = time.perf_counter() - start
    model = trainer.model.train()
    loss = trainer.compute_loss(model, batch)
    loss.backward()
    check.sync()
    backward = time.perf_counter() - start - rollout
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    check.sync()
    total = time.perf_counter() - start
    engine.generate = original
    tokens = int(batch["completion_ids"].numel())
    assert batch["completion_ids"].shape[1] == check.new_tokens, batch["completion_ids"].shape
    result = {"step_s": round(total, 3), "rollout_s": round(rollout, 3), "generate_s": round(timing["generate"], 3),
              "loss_forward_backward_s": round(backward, 3), "optimizer_s": round(total - rollout - backward, 3),
              "generated_tokens": tokens, "generate_tokens_per_s": round(tokens / timing["generate"], 1),
              "prompt_tokens": int(batch["prompt_mask"].sum(dim=1)[0]),
              "video_patches": int(batch["video_grid_thw"][0].prod()), "loss": float(loss.detach())}
    if check.device.type == "cuda":
        result["peak_gpu_memory_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    return result


def stage_grpo_step(check: Check) -> dict:
    model = check.policy()
    ref_model = copy.deepcopy(model).eval().requires_grad_(False)
    model.activation_checkpointing_enable({"use_reentrant": False})  # as the recipes (transformers 5 name)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6, foreach=True)
    out = {"model": "tiny" if check.dry_run else "Qwen2.5-VL-3B shape, random weights",
           "params": sum(p.numel() for p in model.parameters()),
           "settings": {"dtype": "float32" if check.dry_run else "bfloat16", "attn_implementation": "sdpa",
                        "activation_checkpointing": True, "beta": BETA, "new_tokens": check.new_tokens,
                        "clip": CLIP, **(DRY_VIDEO if check.dry_run else TIMEZERO_VIDEO)}}
    for group in (4, 8):
        trainer = _trainer(check, model, ref_model, group)
        items = trainer.data_collator([trainer.train_dataset[0]] * group)
        for share in (True, False):
            if not check.dry_run:
                _timed_step(check, trainer, optimizer, items, share)  # warm-up (kernels, allocator, AdamW state)
            out[f"g{group}_share_{'on' if share else 'off'}"] = _timed_step(check, trainer, optimizer, items, share)
            check.results["stages"]["grpo_step"] = {"status": "running", **out}
            check.write()
        on, off = out[f"g{group}_share_on"], out[f"g{group}_share_off"]
        out[f"g{group}_step_ratio_on_off"] = round(on["step_s"] / off["step_s"], 3)
        del trainer
    check.model = model  # reused by the eval stage
    return out


def _model_and_video(check):
    """The policy in eval mode on the check's device, its processor, and the stage's video settings (dry run: the
    tiny clip's; else TimeZero's)."""
    from grounding_rl.data.video import VideoSettings
    from grounding_rl.models.loading import load_processor

    model = (getattr(check, "model", None) or check.policy()).eval().to(check.device)
    processor = load_processor(str(check.model_dir() if check.dry_run else check.processor_dir()))
    video = DRY_VIDEO if check.dry_run else TIMEZERO_VIDEO
    settings = VideoSettings(fps=video["video_fps"], min_pixels=video["video_min_pixels"],
                             **({"max_pixels": video["video_max_pixels"]} if "video_max_pixels" in video else
                                {"total_pixels": video["video_total_pixels"]}))
    return model, processor, video, settings


def stage_eval(check: Check) -> dict:
    from grounding_rl.data.samples import load_samples
    from grounding_rl.data.video import sample_frames
    from grounding_rl.eval.settings import DEFAULT_MAX_NEW_TOKENS
    from grounding_rl.rollout.generation import SamplingParams, generate_answers

    model, processor, video, settings = _model_and_video(check)
    samples = load_samples(check.shared / "data" / "videos" / "annotations.jsonl")
    if check.dry_run:
        samples = samples[:4]
    max_new = check.new_tokens if check.dry_run else DEFAULT_MAX_NEW_TOKENS
    batch_size, decode_s, generate_s, tokens = 4, 0.0, 0.0, 0
    start = time.perf_counter()
    clips = {}
    for i in range(0, len(samples), batch_size):
        chunk = samples[i:i + batch_size]
        t0 = time.perf_counter()
        videos = [clips.setdefault(s.video, sample_frames(s.video, settings)) for s in chunk]
        decode_s += time.perf_counter() - t0
        check.sync()
        t0 = time.perf_counter()
        with torch.no_grad():
            answers = generate_answers(model, processor, [s.query for s in chunk], videos, "timezero",
                                       SamplingParams.greedy(max_new))
        check.sync()
        generate_s += time.perf_counter() - t0
        tokens += sum(len(processor.tokenizer(a).input_ids) for a in answers)
    total = time.perf_counter() - start
    return {"queries": len(samples), "clips": len(clips), "batch_size": batch_size, "max_new_tokens": max_new,
            "seconds": round(total, 2), "queries_per_s": round(len(samples) / total, 3),
            "generate_s": round(generate_s, 2), "frame_sampling_s": round(decode_s, 2),
            "answer_tokens": tokens}


def stage_check(check: Check) -> dict:
    """``grounding-rl check``'s checks (:mod:`grounding_rl.update.check`: prompt ids, frame times, 3-D positions,
    sampled log-probs against the loss forward's, reference against policy, seconds and peak memory of one rollout
    plus one loss step) on the policy of the ``grpo_step`` stage (the random-weight 3B shape in bf16; no vLLM on the
    GPU machine: vLLM is checked on CPU only), G = 4 on the stage's clip, within ``CHECK_LIMIT_S`` seconds (SIGALRM).
    Its table is what docs/BENCHMARKS.md records when a GPU is lent. Untested on a GPU so far."""
    import signal
    from types import SimpleNamespace

    from grounding_rl.data.video import sample_frames
    from grounding_rl.family import family_of
    from grounding_rl.update.check import cheap_checks, rollout_checks

    def too_long(signum, frame):
        raise TimeoutError(f"grounding-rl check past {CHECK_LIMIT_S} s")

    previous = signal.signal(signal.SIGALRM, too_long)
    signal.alarm(CHECK_LIMIT_S)
    try:
        model, processor, video, settings = _model_and_video(check)
        path = check.shared / "data" / "videos" / CLIP
        clip = sample_frames(path, family_of(processor).video_settings(settings))
        items = [{"index": 0, "video": str(path), "query": "someone cleans the pool", "qid": "check", "clip": clip}]
        args = SimpleNamespace(prompt_template="timezero", video_layout="released", share_video_encoding=True,
                               num_generations=4, max_completion_length=check.new_tokens, temperature=1.0, top_p=1.0,
                               top_k=0, repetition_penalty=1.0)
        reference = copy.deepcopy(model).eval().requires_grad_(False)
        results = cheap_checks(model, processor, items, args, args.num_generations)
        torch.manual_seed(0)
        results += rollout_checks(model, processor, items, args, reference=reference)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    table = [r.line() for r in results]
    failed = [r for r in results if not r.passed]
    out = {"dtype": str(next(model.parameters()).dtype).removeprefix("torch."), "table": table,
           "checks": [{"check": r.name, "passed": r.passed, **r.numbers, "detail": r.detail} for r in results]}
    if failed:
        raise StageError(f"grounding-rl check: {failed[0].line()}", out)
    return out


class StageError(RuntimeError):
    """A stage failed but has results to record."""

    def __init__(self, message: str, result: dict):
        super().__init__(message)
        self.result = result


STAGES = {"environment": stage_environment, "fits": stage_fits, "tests": stage_tests, "grpo_step": stage_grpo_step,
          "check": stage_check, "eval": stage_eval}
CHECK_LIMIT_S = 90  # the check stage's own time limit (seconds)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="the same stages on the CPU with tiny shapes")
    parser.add_argument("--out", type=Path, default=None,
                        help="results JSON (default $OUT/gpu_check.json where OUT is set, else outputs/gpu_check.json)")
    parser.add_argument("--budget-s", type=float, default=285.0, help="start no stage after this many seconds")
    parser.add_argument("--stages", nargs="+", choices=list(STAGES), default=list(STAGES))
    args = parser.parse_args(argv)
    out = args.out or (Path(os.environ["OUT"]) / "gpu_check.json" if os.environ.get("OUT") else
                       REPO / "outputs" / "gpu_check.json")
    if args.dry_run:
        torch.set_num_threads(1)
    check = Check(out, args.dry_run, args.budget_s)
    try:
        failed = run_stages(check, args.stages)
    finally:  # the tiny model and the GRPO step's checkpoints (≈ 50 MB on a dry run) are not results
        shutil.rmtree(check.workdir, ignore_errors=True)
    print(json.dumps({name: stage["status"] for name, stage in check.results["stages"].items()} |
                     {"results": str(out), "elapsed_s": round(check.elapsed(), 1)}))
    return 1 if failed else 0


def run_stages(check: Check, stages: list[str]) -> int:
    """Run ``stages`` in order, recording each in ``check.results`` and writing the JSON after each; returns how
    many failed."""
    failed = 0
    for name in stages:
        if check.elapsed() > check.budget_s:
            check.results["stages"][name] = {"status": "skipped", "reason": f"past the {check.budget_s:.0f} s budget"}
            check.write()
            continue
        start = time.perf_counter()
        print(f"gpu_check: {name} ...", file=sys.stderr, flush=True)
        try:
            result = {"status": "ok", **STAGES[name](check)}
        except Exception as err:  # a failed stage is recorded; the next one still runs
            failed += 1
            result = {"status": "error", **getattr(err, "result", {}), "error": f"{type(err).__name__}: {err}"[:2000],
                      "traceback": traceback.format_exc()[-4000:]}
            print(f"gpu_check: {name} failed: {result['error']}", file=sys.stderr, flush=True)
        result["seconds"] = round(time.perf_counter() - start, 1)
        check.results["stages"][name] = result
        check.write()
    return failed


if __name__ == "__main__":
    sys.exit(main())
