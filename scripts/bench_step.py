"""Benchmark of one GRPO step: sharing the prompt and the video work per group against the per-row path.

    python scripts/bench_step.py [--steps 3] [--threads N] [--mem-rows 2] [--model DIR]

Model: a random-weight Qwen2.5-VL built with :func:`grounding_rl.dev.tiny.build_tiny_model` and the real Qwen
tokenizer (vocabulary 151,665, rounded up to 151,680 rows), with the depth:width and MLP ratios of
``../shared/models/Qwen2.5-VL-3B-Instruct/config.json`` at 1/8 of its text width (:data:`SIZES`):

- text: hidden 256 (3B: 2048), 4 layers (3B: 36 → 36·256/2048 = 4.5, rounded down), MLP 1376 (= 256 · 11008/2048),
  head_dim 128 as the 3B (2 query heads, 1 key/value head; the 3B has 16/2), tied embeddings;
- vision: hidden 160 (= 256 · 1280/2048), depth 4 (= 32 · 160/1280), MLP 428 (≈ 160 · 3420/1280, set after the
  build since the builder fixes 2·hidden), head_dim 80 as the 3B (2 heads), window attention with the last block
  global (the 3B: every 8th), patch 14, temporal patch 2, merge 2, tokens_per_second 2.

Data: ``mmaction2_pool_cleaning.mp4`` (10.0 s) at 2 fps with the TimeZero pixel budget (total_pixels 3584·28·28,
min_pixels 16·28·28): 20 frames, t = 10 temporal groups.

Step: :class:`grounding_rl.update.trainer.GroundingGRPOTrainer` with β = 0.04 (a separate reference model), G rows of
one clip: ``generate_and_score`` (prompt tensors, generation of exactly 32 tokens — ``min_new_tokens`` 32 on the
generation config, so both arms do the same work —, rewards, π_ref forward) then ``compute_loss`` and its backward
(no optimizer step). Three arms alternate on the same trainer and weights: ``prefix`` (``share_video_encoding`` and
``share_prompt_prefix``: one vision encoding, one prefill and one prompt pass of the language model per group),
``video`` (``share_video_encoding`` only: the language model runs every row's whole prompt in the forwards) and
``off`` (the per-row path); one warm-up step each, then ``--steps`` rounds, the order rotating every round; medians.

Memory: one policy forward + backward over ``--mem-rows`` rows of one clip (prompt + 32 completion tokens), each arm
in its own subprocess: ``full`` computes the logits of every position and a full-vocabulary log-softmax (what the
peers do), ``keep`` is :func:`grounding_rl.update.logprobs.completion_logps` per row (``logits_to_keep`` + TRL's
``selective_log_softmax``), ``prefix`` the same with the prompt run once
(:func:`grounding_rl.update.prefix.packed_completion_logps`). Peak RSS = the child's
``resource.getrusage(RUSAGE_SELF).ru_maxrss``.

Prints a table, then a last line of JSON: ``{"step_time_ratio_g4": x, "step_time_ratio_g8": y,
"step_time_ratio_video_only_g4": …, "step_time_ratio_video_only_g8": …, "peak_mem_ratio_logits": z,
"peak_mem_ratio_prefix": w}`` (prefix / off, video / off, keep / full, prefix / keep). Targets: x ≤ 0.45, y ≤ 0.35,
z ≤ 0.5. Record the results in docs/BENCHMARKS.md.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

from bench_video import cpu_model  # noqa: E402  (scripts/ is on sys.path when run as a script)

CLIP = "mmaction2_pool_cleaning.mp4"
COMPLETION_TOKENS = 32
BETA = 0.04
SIZES = dict(hidden_size=256, num_layers=4, num_heads=2, num_kv_heads=1, intermediate_size=1376,
             vision_hidden_size=160, vision_depth=4, vision_heads=2)
VISION_INTERMEDIATE = 428
VIDEO = dict(video_fps=2.0, video_total_pixels=3584 * 28 * 28, video_min_pixels=16 * 28 * 28)


def build_model(out: Path, tokenizer: Path) -> Path:
    """The scaled-down 3B (:data:`SIZES`), saved with its processor in ``out``; reused when already there."""
    from transformers import AutoConfig, Qwen2_5_VLForConditionalGeneration

    from grounding_rl.dev.tiny import build_tiny_model

    if (out / "config.json").is_file():
        return out
    build_tiny_model(out, tokenizer=tokenizer, seed=0, **SIZES)
    config = AutoConfig.from_pretrained(out)
    config.vision_config.intermediate_size = VISION_INTERMEDIATE
    torch.manual_seed(0)
    model = Qwen2_5_VLForConditionalGeneration(config).eval()
    model.generation_config = Qwen2_5_VLForConditionalGeneration.from_pretrained(out).generation_config
    model.save_pretrained(out)
    return out


def _varied_reward(completions, **columns):
    return [float(sum(map(ord, c)) % 97) / 97.0 for c in completions]


def make_trainer(model_dir: Path, clip: Path, group: int, out: Path):
    from grounding_rl.models.loading import load_policy, load_processor
    from grounding_rl.update.config import GroundingGRPOConfig
    from grounding_rl.data.dataset import GroundingDataset
    from grounding_rl.update.trainer import GroundingGRPOTrainer

    args = GroundingGRPOConfig(
        output_dir=str(out), use_cpu=True, per_device_train_batch_size=group, num_generations=group, max_steps=1,
        max_completion_length=COMPLETION_TOKENS, beta=BETA, report_to=[], save_strategy="no", seed=0,
        dataloader_num_workers=0, max_prompt_length=None, **VIDEO)
    dataset = GroundingDataset([{"video": str(clip), "query": "a person cleans the pool", "start": 1.0, "end": 4.0,
                                 "duration": 10.0, "qid": "bench"}])
    trainer = GroundingGRPOTrainer(load_policy(str(model_dir)), args, dataset, load_processor(str(model_dir)),
                                   reward_funcs=[_varied_reward])
    trainer.model.generation_config.min_new_tokens = COMPLETION_TOKENS  # exactly 32 tokens in both arms
    return trainer


ARMS = ("prefix", "video", "off")


def timed_step(trainer, items, arm: str) -> dict:
    """One GRPO step in ``arm`` (:data:`ARMS`); seconds of the whole step and of its parts."""
    trainer.args.share_video_encoding = arm != "off"
    trainer.share_prompt = arm == "prefix"
    parts = {"ref": 0.0}
    original = trainer._ref_logps

    def ref_logps(batch):
        start = time.perf_counter()
        out = original(batch)
        parts["ref"] += time.perf_counter() - start
        return out

    trainer._ref_logps = ref_logps
    torch.manual_seed(0)
    start = time.perf_counter()
    batch = trainer.generate_and_score(items)
    rollout = time.perf_counter() - start
    model = trainer.model.train()
    model.zero_grad(set_to_none=True)
    loss = trainer.compute_loss(model, batch)
    loss.backward()
    total = time.perf_counter() - start
    trainer._ref_logps = original
    assert batch["completion_ids"].shape[1] == COMPLETION_TOKENS and batch["completion_mask"].all()
    return {"step": total, "generation": rollout - parts["ref"], "ref": parts["ref"], "policy": total - rollout,
            "prompt_tokens": int(batch["prompt_mask"].sum(dim=1)[0]), "patches": int(batch["video_grid_thw"][0].prod())}


def bench_group(model_dir: Path, clip: Path, group: int, steps: int, out: Path) -> dict:
    trainer = make_trainer(model_dir, clip, group, out)
    items = trainer.data_collator([trainer.train_dataset[0]] * group)
    results = {arm: [] for arm in ARMS}
    for arm in ARMS:
        timed_step(trainer, items, arm)  # warm-up
    for round_ in range(steps):
        for arm in ARMS[round_ % 3:] + ARMS[:round_ % 3]:
            results[arm].append(timed_step(trainer, items, arm))
            print(f"  G={group} {arm:6} step {results[arm][-1]['step']:.2f} s (load {os.getloadavg()[0]:.1f})",
                  file=sys.stderr, flush=True)
    summary = {arm: {key: statistics.median(r[key] for r in runs) for key in ("step", "generation", "ref", "policy")}
               for arm, runs in results.items()}
    summary["prompt_tokens"], summary["patches"] = results["off"][0]["prompt_tokens"], results["off"][0]["patches"]
    summary["ratio"] = summary["prefix"]["step"] / summary["off"]["step"]
    summary["ratio_video_only"] = summary["video"]["step"] / summary["off"]["step"]
    return summary


# ------------------------------------------------------------------------------------------------------ memory
def memory_child(model_dir: Path, clip: Path, rows: int, arm: str) -> None:
    """One policy forward + backward over ``rows`` rows; prints ``{"peak_rss_bytes": ...}``."""
    from trl.trainer.utils import selective_log_softmax

    from grounding_rl.data.video import sample_frames
    from grounding_rl.models.loading import load_policy, load_processor
    from grounding_rl.update import batching
    from grounding_rl.update.config import GroundingGRPOConfig
    from grounding_rl.update.logprobs import completion_logps

    settings = GroundingGRPOConfig(output_dir=tempfile.mkdtemp(), use_cpu=True, **VIDEO).video_settings
    processor = load_processor(str(model_dir))
    model = load_policy(str(model_dir)).train()
    item = {"index": 0, "query": "a person cleans the pool", "clip": sample_frames(clip, settings)}
    batch = batching.prompt_batch(processor, [item] * rows, "default", share_videos=True)
    generator = torch.Generator().manual_seed(0)
    batch["completion_ids"] = torch.randint(0, 150000, (rows, COMPLETION_TOKENS), generator=generator)
    batch["completion_mask"] = torch.ones(rows, COMPLETION_TOKENS, dtype=torch.long)
    if arm in ("keep", "prefix"):
        logps = completion_logps(model, batch, share_prompt=arm == "prefix")
    else:  # every position's logits, full-vocabulary log-softmax, then the completion tokens
        inputs = batching.forward_inputs(batch)
        from grounding_rl.models.vision import encode_videos

        inputs["mm_encoder_outputs"] = encode_videos(model, inputs.pop("pixel_values_videos"),
                                                     batching.clip_grid(batch), inputs.pop("video_index"))
        logits = model(**inputs, use_cache=False).logits[:, :-1]
        all_logps = logits.log_softmax(dim=-1).gather(-1, inputs["input_ids"][:, 1:].unsqueeze(-1)).squeeze(-1)
        logps = all_logps[:, -COMPLETION_TOKENS:]
        reference = selective_log_softmax(logits[:, -COMPLETION_TOKENS:], batch["completion_ids"])
        assert torch.allclose(logps, reference, atol=1e-4)
    (-logps.mean()).backward()
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    print(json.dumps({"arm": arm, "peak_rss_bytes": peak_kib * 1024, "vm_hwm_bytes": _vm_hwm(),
                      "sequence_length": batch["prompt_ids"].shape[1] + COMPLETION_TOKENS}))


def _vm_hwm() -> int | None:
    """Peak RSS of this process image (/proc/self/status VmHWM), bytes; None where unavailable."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def run_memory(model_dir: Path, clip: Path, rows: int, threads: int) -> dict:
    """Both memory arms, each in a fresh subprocess.

    Linux keeps ``ru_maxrss`` across ``exec``: a child forked from a parent holding N bytes reports at least N. Run
    this before the timing (while this process is small) — ``vm_hwm_bytes`` (per process image) cross-checks it.
    """
    results = {}
    for arm in ("keep", "prefix", "full"):
        cmd = [sys.executable, __file__, "--mem-child", arm, "--model", str(model_dir), "--clip", str(clip),
               "--mem-rows", str(rows), "--threads", str(threads)]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode:
            raise RuntimeError(f"memory child {arm} failed:\n{proc.stderr[-3000:]}")
        results[arm] = json.loads(proc.stdout.strip().splitlines()[-1])
    return results


# ------------------------------------------------------------------------------------------------------ main
def main(argv: list[str] | None = None) -> int:
    from grounding_rl.paths import shared_dir

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3, help="timed steps per arm after one warm-up")
    parser.add_argument("--groups", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (1: on a shared machine, more threads than free cores stall at barriers)")
    parser.add_argument("--mem-rows", type=int, default=2, help="rows in the memory measurement")
    parser.add_argument("--model", type=Path, default=None, help="model folder (built there when missing)")
    parser.add_argument("--clip", type=Path, default=None)
    parser.add_argument("--mem-child", choices=["full", "keep", "prefix"], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    shared = shared_dir()
    if shared is None and (args.model is None or args.clip is None):
        parser.error("../shared is missing: set GROUNDING_RL_SHARED or pass --model and --clip")
    clip = args.clip or shared / "data" / "videos" / CLIP
    if args.mem_child:
        memory_child(args.model, clip, args.mem_rows, args.mem_child)
        return 0
    workdir = Path(tempfile.mkdtemp(prefix="bench_step_"))
    model_dir = build_model(args.model or workdir / "model", shared / "models" / "Qwen2.5-VL-7B-Instruct")

    print(f"machine: {os.cpu_count()} CPUs ({cpu_model()}), torch {torch.__version__}, threads {args.threads}, "
          f"load {os.getloadavg()[0]:.2f} at start, {time.strftime('%Y-%m-%d %H:%M')}")
    print(f"model: {SIZES} vision MLP {VISION_INTERMEDIATE}; clip {clip.name}; {VIDEO}; beta {BETA}; "
          f"{COMPLETION_TOKENS} completion tokens; median of {args.steps} steps after 1 warm-up")
    memory = run_memory(model_dir, clip, args.mem_rows, args.threads)  # first: see run_memory
    summaries = {}
    for group in args.groups:
        s = summaries[group] = bench_group(model_dir, clip, group, args.steps, workdir / f"out{group}")
        print(f"G={group}: prompt {s['prompt_tokens']} tokens, {s['patches']} patches per clip")
        print(f"  {'arm':6} {'step s':>8} {'generation':>11} {'policy f+b':>11} {'reference':>10}")
        for arm in ARMS:
            r = s[arm]
            print(f"  {arm:6} {r['step']:8.2f} {r['generation']:11.2f} {r['policy']:11.2f} {r['ref']:10.2f}")
        print(f"  prefix/off {s['ratio']:.3f}, video/off {s['ratio_video_only']:.3f}")
    peak = {arm: memory[arm]["peak_rss_bytes"] for arm in ("keep", "prefix", "full")}
    hwm = {arm: (memory[arm]["vm_hwm_bytes"] or 0) / 2**20 for arm in peak}
    print(f"memory, policy forward+backward over {args.mem_rows} rows of {memory['keep']['sequence_length']} tokens: "
          + ", ".join(f"{arm} {peak[arm] / 2**20:.0f} MiB (VmHWM {hwm[arm]:.0f})" for arm in peak)
          + f" peak RSS (ru_maxrss); load {os.getloadavg()[0]:.2f} at end")
    result = {f"step_time_ratio_g{g}": round(s["ratio"], 3) for g, s in summaries.items()}
    result.update({f"step_time_ratio_video_only_g{g}": round(s["ratio_video_only"], 3) for g, s in summaries.items()})
    result["peak_mem_ratio_logits"] = round(peak["keep"] / peak["full"], 3)
    result["peak_mem_ratio_prefix"] = round(peak["prefix"] / peak["keep"], 3)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
