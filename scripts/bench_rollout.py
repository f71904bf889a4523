"""Rollout throughput: vLLM against transformers' ``generate``, G completions of one video prompt, in one run.

    .venv-vllm/bin/python scripts/bench_rollout.py [--tokens 32] [--repeats 3] [--model DIR]

(vLLM is needed: ``bash scripts/setup_vllm_cpu.sh`` on CPU, ``pip install -e ".[vllm]"`` on GPUs.)

Model: the scaled-down Qwen2.5-VL-3B of ``scripts/bench_step.py`` (text hidden 256, 4 layers, head_dim 128 as the 3B,
the real 151,665-token vocabulary; random weights), fp32 on CPU, bf16 on a GPU. Data: ``mmaction2_pool_cleaning.mp4``
(10.0 s) at 2 fps with the TimeZero pixel budget: 20 frames. For G = 4 and 8: G rows of the same prompt, each
sampling exactly ``--tokens`` tokens (temperature 1; ``min_new_tokens`` / ``min_tokens`` so both engines do the same
work): ``hf`` is ``model.generate`` on the G rows (KV cache on, the vision tower and prefill per row, as the peers
run it); ``vllm`` is :class:`grounding_rl.rollout.vllm.VLLMEngine` (its own batching, prefix caching and
multimodal cache). One warm-up call each, then ``--repeats`` calls; the median wall time. Tokens per second =
G · tokens / time.

Prints a table and a last line of JSON: ``{"device", "hf_tokens_per_s_g4", "vllm_tokens_per_s_g4", "speedup_g4", …
g8}``. Record the results in docs/BENCHMARKS.md.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

import torch  # noqa: E402

from bench_step import CLIP, VIDEO, build_model  # noqa: E402  (scripts/ is on sys.path when run as a script)
from bench_video import cpu_model  # noqa: E402

GROUPS = (4, 8)
QUERY = "a person cleans the pool"


def timed(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=32, help="completion tokens per row")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--model", default=None, help="model folder (default: build the scaled-down 3B in a temp dir)")
    args = parser.parse_args(argv)

    import vllm

    from grounding_rl.data.video import VideoSettings, sample_frames
    from grounding_rl.family import family_of
    from grounding_rl.models.loading import load_policy, load_processor
    from grounding_rl.paths import shared_dir
    from grounding_rl.prompts.preprocessing import build_inputs
    from grounding_rl.rollout.vllm import VLLMEngine, vllm_prompts

    shared = shared_dir()
    if shared is None:
        sys.exit("bench_rollout: ../shared is missing (set GROUNDING_RL_SHARED)")
    tmp = tempfile.mkdtemp(prefix="bench_rollout_")
    model_dir = Path(args.model) if args.model else build_model(Path(tmp) / "model",
                                                                shared / "models" / "Qwen2.5-VL-7B-Instruct")
    cuda = torch.cuda.is_available()
    dtype = torch.bfloat16 if cuda else torch.float32
    model = load_policy(str(model_dir), dtype=str(dtype).removeprefix("torch.")).eval().to("cuda" if cuda else "cpu")
    processor = load_processor(str(model_dir))
    family = family_of(model)
    settings = VideoSettings(fps=VIDEO["video_fps"], total_pixels=VIDEO["video_total_pixels"],
                             min_pixels=VIDEO["video_min_pixels"])
    clip = sample_frames(shared / "data" / "videos" / CLIP, family.video_settings(settings))
    pad = processor.tokenizer.pad_token_id
    eos = model.generation_config.eos_token_id
    engine = VLLMEngine(str(model_dir), eos, pad, dtype=str(dtype).removeprefix("torch."), max_model_len=4096,
                        logps_need_correcting=False)
    results = {"device": torch.cuda.get_device_name() if cuda else cpu_model(), "frames": clip.num_frames,
               "tokens": args.tokens}
    rows = []
    for group in GROUPS:
        inputs = build_inputs(processor, [QUERY] * group, [clip] * group, "default").to(model.device)
        hf_kwargs = {k: v for k, v in inputs.items()}

        def hf():
            with torch.no_grad():
                model.generate(**hf_kwargs, do_sample=True, temperature=1.0, top_p=1.0, top_k=None,
                               max_new_tokens=args.tokens, min_new_tokens=args.tokens, pad_token_id=pad)

        token_ids = {k: getattr(model.config, k) for k in ("video_token_id", "vision_start_token_id",
                                                           "vision_end_token_id")}
        prompts, _ = vllm_prompts({k: v.cpu() for k, v in inputs.items() if k in ("input_ids", "attention_mask")},
                                  [clip] * group, family, token_ids)
        sampling = vllm.SamplingParams(n=1, temperature=1.0, max_tokens=args.tokens, min_tokens=args.tokens,
                                       detokenize=False, logprobs=0)

        def run_vllm():
            outputs = engine.llm.generate(prompts, sampling, use_tqdm=False)
            assert all(len(o.outputs[0].token_ids) == args.tokens for o in outputs)

        hf_time = timed(hf, args.repeats)
        vllm_time = timed(run_vllm, args.repeats)
        hf_rate, vllm_rate = group * args.tokens / hf_time, group * args.tokens / vllm_time
        results[f"hf_tokens_per_s_g{group}"] = round(hf_rate, 2)
        results[f"vllm_tokens_per_s_g{group}"] = round(vllm_rate, 2)
        results[f"speedup_g{group}"] = round(vllm_rate / hf_rate, 3)
        rows.append((group, hf_time, hf_rate, vllm_time, vllm_rate))
    print(f"{'G':>3} {'hf s':>8} {'hf tok/s':>9} {'vllm s':>8} {'vllm tok/s':>10} {'speedup':>8}")
    for group, hf_time, hf_rate, vllm_time, vllm_rate in rows:
        print(f"{group:>3} {hf_time:>8.3f} {hf_rate:>9.1f} {vllm_time:>8.3f} {vllm_rate:>10.1f} "
              f"{vllm_rate / hf_rate:>8.2f}")
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
