"""``grounding-rl check``'s checks: do rollout and training see the same video tokens, timestamps and positions on a
user's own model, versions and clips.

Each side of a comparison is built by the code path that uses it, never taken from one shared tensor:

* the *loss* side is :func:`grounding_rl.update.batching.prompt_batch` (one copy per row) → ``forward_inputs``, what
  the policy and reference forwards receive;
* the *rollout* side is a second ``prompt_batch`` call as the trainer's sampler makes it (``share_video_encoding``:
  one copy per clip and ``video_index``) → ``generation_inputs``, and its shared-prefix re-padding
  (:func:`grounding_rl.rollout.shared.shared_prefix_layout`) that ``generate`` continues from;
* the *eval/infer* side is :func:`grounding_rl.prompts.preprocessing.build_inputs` as ``generate_answers`` calls it;
* the *vLLM* side is the prompt vLLM's own processor expands from the collapsed row and the clip
  (:func:`grounding_rl.rollout.vllm.vllm_prompts`).

In the HF-only setting the loss and rollout prompts come from the same function on the same processor, so (a) and (c)
between them are equal by construction unless the processor is not deterministic; the comparisons that can break
there are the eval/infer path, the shared-prefix layout, the frames (b) and the log-probs (d). With vLLM every check
crosses two implementations.

Every check returns a :class:`Check`: its name, the clip, pass or fail, the numbers and one line. Nothing here draws
from the global RNG except :func:`sampled_logprobs` (sampling; ``grounding-rl check`` runs it in a forked RNG).
"""
from __future__ import annotations

import re
import time
from dataclasses import dataclass, field

import torch

from grounding_rl.data.video import presentation_times
from grounding_rl.family import family_of
from grounding_rl.models.vision import rope_position_ids
from grounding_rl.prompts.preprocessing import VIDEO_INDEX, build_inputs
from grounding_rl.rollout.shared import shared_prefix_layout
from grounding_rl.update import batching

FALLBACK_FPS = 24.0  # transformers' video processors assume it for frames given without metadata
TIME_TOLERANCE = 0.002  # seconds: sampled presentation times against the stream's (µs rounding, float sums)

# Log-prob thresholds per (engine, dtype): (mean |Δ|, per-token |Δ|, share of tokens beyond the per-token one).
# fp32 HF: KV-cache decoding against a full forward, ~1e-6 per token; vLLM on CPU fp32: up to ≈ 0.01 per token
# (README, "Known gaps"; 1e-6 measured on the tiny models); bf16: rounding of logits near -12 is 0.06. A dtype
# mismatch (bf16 one side, fp32 the other) gives mean |Δ| 0.021, max 0.041 on the tiny Qwen2.5-VL, failing both fp32
# rows (tests/test_check.py).
LOGP_THRESHOLDS = {("hf", "float32"): (1e-3, 1e-2, 0.0), ("hf", "bfloat16"): (0.1, 0.5, 0.05),
                   ("vllm", "float32"): (0.01, 0.03, 0.05), ("vllm", "bfloat16"): (0.2, 1.0, 0.1)}
REF_TOLERANCE = {"float32": 0.0, "bfloat16": 1e-2}  # reference against policy before any update, max |Δ|


@dataclass
class Check:
    """One check on one clip: ``name`` (``a.prompt_ids``, ``b.frame_times``...), ``clip`` (the video's name),
    ``passed``, ``numbers`` (what the line prints, every value for ``--json``) and ``detail`` (why it failed)."""

    name: str
    clip: str
    passed: bool
    numbers: dict = field(default_factory=dict)
    detail: str = ""

    def line(self) -> str:
        """``PASS a.prompt_ids  clip.mp4  rows=4 tokens=312 — detail``."""
        nums = " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in self.numbers.items())
        tail = f" — {self.detail}" if self.detail else ""
        return f"{'PASS' if self.passed else 'FAIL'} {self.name:<26} {self.clip:<28} {nums}{tail}"


# ---------------------------------------------------------------------------------------------------------- (a) ids
def compare_ids(name: str, clip: str, got: list[int], want: list[int], decode=None, what: str = "") -> Check:
    """Two token-id rows compared; on a mismatch the first differing position and the tokens there (decoded with
    ``decode``, ids → text, when given), and both lengths. E.g. [1, 2, 3] against [1, 5, 3]: position 1, 2 vs 5."""
    numbers = {"tokens": len(want)}
    if list(got) == list(want):
        return Check(name, clip, True, numbers)
    first = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
    shown = (lambda ids: repr(decode(ids))) if decode is not None else (lambda ids: str(ids))
    numbers.update(got_tokens=len(got), first_diff=first)
    return Check(name, clip, False, numbers,
                 f"{what}{len(got)} vs {len(want)} tokens, first difference at position {first}: "
                 f"{shown(list(got[first:first + 3]))} vs {shown(list(want[first:first + 3]))}")


def rows(ids: torch.Tensor, mask: torch.Tensor) -> list[list[int]]:
    """Each row's token ids without its padding."""
    return [[int(t) for t, keep in zip(r.tolist(), m.tolist()) if keep] for r, m in zip(ids, mask)]


# ---------------------------------------------------------------------------------------------------------- (b) frames
def check_frame_times(clip_name: str, video) -> Check:
    """(b) The sampled frames' times (:attr:`SampledVideo.timestamps`) against the decoded stream's presentation
    times of the same source frames (PyAV's packet pts, :func:`grounding_rl.data.video.presentation_times`); max |Δ|
    in seconds, tolerance :data:`TIME_TOLERANCE`. The exact sampler read the same packet pts, so this catches a frame
    count, index or window mismatch (and a cache entry of another file), not a misread pts; the independent time
    checks are :func:`check_timestamps` and :func:`check_grid_seconds`."""
    if not video.backend.startswith(("decord", "pyav")):  # qwen_vl_utils, lmms_eval: nominal times by design
        return Check("b.frame_times", clip_name, True, {"frames": video.num_frames},
                     f"not compared: the {video.backend.split('/')[0]} sampler's times are index / fps by design")
    total = round(video.duration * video.source_fps)  # the decoded frame count (duration = total / source_fps)
    stream = presentation_times(video.path, total, video.source_fps)
    deltas = [abs(video.timestamps[k] - stream[i]) for k, i in enumerate(video.frame_indices)]
    worst = max(deltas, default=0.0)
    ok = worst <= TIME_TOLERANCE
    return Check("b.frame_times", clip_name, ok, {"frames": video.num_frames, "max_dt_s": worst},
                 "" if ok else f"frame {deltas.index(worst)} is {worst:.3f} s off the stream's presentation time")


TIMESTAMP = re.compile(r"<(\d+(?:\.\d+)?) seconds>")


def check_timestamps(clip_name: str, prompt: str, timestamps: list[float]) -> Check:
    """(b) Qwen3-VL: each ``<t seconds>`` of the prompt text against the mean time of its frame pair (one decimal, as
    the processor prints it: |Δ| ≤ 0.05 s + rounding). A 24-fps fallback (frames without metadata) or indices taken
    for times shows as a wrong pair; the line names the first such group and whether it matches the fallback."""
    printed = [float(t) for t in TIMESTAMP.findall(prompt)]
    want = [(timestamps[i] + timestamps[i + 1]) / 2 for i in range(0, len(timestamps) - 1, 2)]
    numbers = {"groups": len(want), "printed": len(printed)}
    if len(printed) != len(want):
        return Check("b.timestamps", clip_name, False, numbers,
                     f"{len(printed)} <t seconds> in the prompt for {len(want)} frame pairs")
    deltas = [abs(p - w) for p, w in zip(printed, want)]
    numbers["max_dt_s"] = max(deltas, default=0.0)
    bad = next((g for g, d in enumerate(deltas) if d > 0.05 + 1e-6), None)
    if bad is None:
        return Check("b.timestamps", clip_name, True, numbers)
    fallback = [(2 * g + 0.5) / FALLBACK_FPS for g in range(len(want))]
    why = (" — the 24-fps fallback (frames given without metadata)"
           if all(abs(p - f) <= 0.05 + 1e-6 for p, f in zip(printed, fallback)) else "")
    return Check("b.timestamps", clip_name, False, numbers,
                 f"group {bad} is stamped <{printed[bad]:.1f} seconds>, its frames' mean time is {want[bad]:.2f} s"
                 f"{why}")


def check_grid_seconds(clip_name: str, second_per_grid_ts: float, sampled_fps: float,
                       temporal_patch_size: int = 2) -> Check:
    """(b) Qwen2.5-VL: ``second_per_grid_ts`` against temporal_patch_size / sampled fps (the 3D RoPE's time step);
    names the 24-fps fallback (2 / 24 = 0.0833)."""
    want = temporal_patch_size / sampled_fps
    delta = abs(second_per_grid_ts - want)
    ok = delta <= 1e-4 * max(1.0, want)
    numbers = {"second_per_grid_ts": float(second_per_grid_ts), "expected": want}
    if ok:
        return Check("b.second_per_grid_ts", clip_name, True, numbers)
    why = (" — the 24-fps fallback (frames given without metadata)"
           if abs(second_per_grid_ts - temporal_patch_size / FALLBACK_FPS) < 1e-4 else "")
    return Check("b.second_per_grid_ts", clip_name, False, numbers,
                 f"{second_per_grid_ts:.4f} s per temporal patch, expected {temporal_patch_size} / "
                 f"{sampled_fps:.4g} fps = {want:.4f}{why}")


def check_processed_frames(clip_name: str, processor, video, input_ids: torch.Tensor, features: dict,
                           row: int = 0) -> list[Check]:
    """(b) What the processor made of ``video`` (row ``row`` of its output): the family's time check
    (:func:`check_timestamps` or :func:`check_grid_seconds`)."""
    family = family_of(processor)
    if "second_per_grid_ts" in features:
        patch = getattr(processor.video_processor, "temporal_patch_size", 2)
        return [check_grid_seconds(clip_name, float(features["second_per_grid_ts"][row]), video.sampled_fps, patch)]
    if family.name.startswith("qwen3"):
        text = processor.tokenizer.decode(input_ids.tolist(), skip_special_tokens=False)
        return [check_timestamps(clip_name, text, video.timestamps)]
    return []


# ---------------------------------------------------------------------------------------------------------- (c) rope
def valid_positions(positions: torch.Tensor, mask: torch.Tensor) -> list[torch.Tensor]:
    """Each row's (3, n) position ids at its unpadded tokens, from (3, B, L) ids and a (B, L) mask."""
    return [positions[:, r, mask[r].bool()] for r in range(mask.shape[0])]


def compare_positions(name: str, clip: str, got: torch.Tensor, want: torch.Tensor) -> Check:
    """(c) Two rows' (3, n) 3-D position ids: equal, or the first differing token and both triples."""
    numbers = {"tokens": int(want.shape[1])}
    if got.shape == want.shape and torch.equal(got, want):
        return Check(name, clip, True, numbers)
    if got.shape != want.shape:
        return Check(name, clip, False, numbers, f"{got.shape[1]} vs {want.shape[1]} positioned tokens")
    first = int((got != want).any(dim=0).nonzero()[0])
    return Check(name, clip, False, dict(numbers, first_diff=first),
                 f"token {first}: (t, h, w) {got[:, first].tolist()} vs {want[:, first].tolist()}")


# ---------------------------------------------------------------------------------------------------------- a, b, c
def cheap_checks(model, processor, items: list[dict], args, num_generations: int = 2) -> list[Check]:
    """(a), (b) and (c) on ``items`` (collated, each with its decoded ``clip``), as ``train`` runs them on its first
    batch: no forward, no sampling, no global RNG.

    Args:
        model: the policy (its ``get_rope_index``).
        processor: its processor.
        items: one item per distinct clip.
        args: ``prompt_template``, ``video_layout``, ``share_video_encoding`` (a GRPO config).
        num_generations: G rows per clip in the rollout batch (≥ 2 exercises the shared prefix).
    """
    template, layout = args.prompt_template, args.video_layout
    grouped = [dict(it) for it in items for _ in range(max(1, num_generations))]
    loss = batching.prompt_batch(processor, grouped, template, share_videos=False, video_layout=layout)
    rollout = batching.prompt_batch(processor, grouped, template, share_videos=bool(args.share_video_encoding),
                                    video_layout=layout)
    served = build_inputs(processor, [it["query"] for it in items], [it["clip"] for it in items],
                          [it.get("prompt_template") or template for it in items], share_videos=True,
                          video_layout=layout)
    empty = torch.zeros(len(grouped), 0, dtype=torch.long)
    loss_inputs = batching.forward_inputs(dict(loss, completion_ids=empty, completion_mask=empty))
    gen_inputs = batching.generation_inputs(rollout)
    loss_ids = rows(loss_inputs["input_ids"], loss_inputs["attention_mask"])
    gen_ids = rows(gen_inputs["input_ids"], gen_inputs["attention_mask"])
    served_ids = rows(served["input_ids"], served["attention_mask"])
    decode = lambda ids: processor.tokenizer.decode(ids, skip_special_tokens=False)  # noqa: E731
    unwrapped = getattr(model, "get_base_model", lambda: model)()
    loss_pos = valid_positions(rope_position_ids(unwrapped, loss_inputs), loss_inputs["attention_mask"])
    gen_pos = valid_positions(rope_position_ids(unwrapped, gen_inputs), gen_inputs["attention_mask"])
    served_pos = valid_positions(rope_position_ids(unwrapped, served), served["attention_mask"])
    shared_pos = None
    if VIDEO_INDEX in gen_inputs:
        layout_rows = shared_prefix_layout(gen_inputs, gen_inputs[VIDEO_INDEX])
        if layout_rows is not None:
            per_row = layout_rows[0]
            shared_pos = valid_positions(rope_position_ids(unwrapped, per_row), per_row["attention_mask"])
    out: list[Check] = []
    for u, item in enumerate(items):
        name = str(item["video"]).rsplit("/", 1)[-1]
        group = range(u * max(1, num_generations), (u + 1) * max(1, num_generations))
        checks = [compare_ids("a.prompt_ids rollout", name, gen_ids[r], loss_ids[r], decode) for r in group]
        checks.append(compare_ids("a.prompt_ids eval/infer", name, served_ids[u], loss_ids[group[0]], decode))
        out.append(_first_failure(checks, len(group)))
        out.append(check_frame_times(name, item["clip"]))
        out += check_processed_frames(name, processor, item["clip"], served["input_ids"][u], served, u)
        if "second_per_grid_ts" in loss:  # the loss batch's own value too
            patch = getattr(processor.video_processor, "temporal_patch_size", 2)
            loss_check = check_grid_seconds(name, float(loss["second_per_grid_ts"][group[0]]),
                                            item["clip"].sampled_fps, patch)
            loss_check.name += " loss"
            out.append(loss_check)
        checks = [compare_positions("c.positions rollout", name, gen_pos[r], loss_pos[r]) for r in group]
        checks.append(compare_positions("c.positions eval/infer", name, served_pos[u], loss_pos[group[0]]))
        if shared_pos is not None:
            checks += [compare_positions("c.positions shared", name, shared_pos[r], gen_pos[r]) for r in group]
        out.append(_first_failure(checks, len(group)))
    return out


def _first_failure(checks: list[Check], rows_per_clip: int, name: str | None = None) -> Check:
    """One line for several comparisons of one kind: the first failing one, else one passing line named ``name``
    (default: the first word of the first check's name) with the number of comparisons made."""
    bad = next((c for c in checks if not c.passed), None)
    if bad is not None:
        return bad
    first = checks[0]
    return Check(name or first.name.split(" ")[0], first.clip, True,
                 dict(first.numbers, rows=rows_per_clip, comparisons=len(checks)))


# ---------------------------------------------------------------------------------------------------------- (d) logps
def compare_logps(name: str, clip: str, got: torch.Tensor, want: torch.Tensor, mask: torch.Tensor,
                  thresholds: tuple[float, float, float]) -> Check:
    """(d) Per-token log-probs of the same tokens from two sides: mean and max |Δ|, the k3 estimate of the mismatch
    KL (E[exp(r) − 1 − r], r = want − got, Schulman's k3, as TRL's KL), the share of tokens with |Δ| above the
    per-token threshold. Fails when mean |Δ| > ``thresholds[0]`` or that share > ``thresholds[2]``.

    Args:
        got, want: (B, C) log-probs (e.g. the sampler's and the training forward's).
        mask: (B, C) 1 at completion tokens.
        thresholds: (mean |Δ|, per-token |Δ|, share).
    """
    m = mask.bool()
    g, w = got.double()[m], want.double()[m]
    if g.numel() == 0:
        return Check(name, clip, True, {"tokens": 0})
    delta = (g - w).abs()
    r = w - g
    numbers = {"tokens": int(g.numel()), "mean_abs": float(delta.mean()), "max_abs": float(delta.max()),
               "k3_kl": float((torch.exp(r) - 1 - r).mean()),
               "share_beyond": float((delta > thresholds[1]).double().mean())}
    ok = numbers["mean_abs"] <= thresholds[0] and numbers["share_beyond"] <= thresholds[2]
    return Check(name, clip, ok, numbers,
                 "" if ok else f"mean |Δ| {numbers['mean_abs']:.4g} (limit {thresholds[0]:g}), "
                 f"{numbers['share_beyond']:.1%} of tokens beyond {thresholds[1]:g} (limit {thresholds[2]:.0%})")


def sampled_logprobs(model, inputs: dict, params) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one completion per row on the rollout path (:func:`grounding_rl.rollout.generation.generate`'s call,
    shared prefix included) and return ``(completion_ids (B, C), the sampler's log-probs (B, C))``: from the logits
    ``generate`` sampled from (``output_logits``), after the temperature."""
    from grounding_rl.prompts.preprocessing import MODEL_INPUT_KEYS
    from grounding_rl.rollout.shared import generate_shared

    kwargs = {k: inputs[k] for k in MODEL_INPUT_KEYS if k in inputs}
    decoding = dict(params.generate_kwargs(), output_logits=True, return_dict_in_generate=True,
                    pad_token_id=completion_token_ids_pad(model))
    with torch.no_grad():
        if VIDEO_INDEX in inputs:
            out, width = generate_shared(model, kwargs, inputs[VIDEO_INDEX], **decoding)
        else:
            out, width = model.generate(**kwargs, use_cache=True, **decoding), kwargs["input_ids"].shape[1]
    ids = out.sequences[:, width:]
    logits = torch.stack(out.logits, dim=1).float() / (params.temperature if params.do_sample else 1.0)
    logps = torch.log_softmax(logits, dim=-1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    return ids, logps


def completion_token_ids_pad(model) -> int | None:
    """The pad id ``generate`` fills stopped rows with (the model's generation config)."""
    config = getattr(model, "generation_config", None)
    pad = getattr(config, "pad_token_id", None)
    if pad is None:
        eos = getattr(config, "eos_token_id", None)
        pad = eos[0] if isinstance(eos, list) else eos
    return pad


# ---------------------------------------------------------------------------------------------------------- (e) cost
def peak_memory_gib(device) -> tuple[str, float]:
    """``("gpu_peak_gib", …)`` on CUDA (``max_memory_allocated``), else ``("rss_peak_gib", …)``, the process's peak
    resident memory (``ru_maxrss``)."""
    if torch.device(device).type == "cuda":
        return "gpu_peak_gib", torch.cuda.max_memory_allocated(device) / 2**30
    import resource

    return "rss_peak_gib", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


# ---------------------------------------------------------------------------------------------------------- d, e
def rollout_checks(model, processor, items: list[dict], args, engine=None, reference=None,
                   thresholds: tuple[float, float, float] | None = None) -> list[Check]:
    """(d) and (e) on each item's clip: G = ``args.num_generations`` completions sampled on the rollout path (HF
    ``generate`` through the shared prefix, or ``engine``, a :class:`grounding_rl.rollout.vllm.VLLMEngine`, whose
    prompt ids (a) are compared too), their log-probs against the loss forward's
    (:func:`grounding_rl.update.logprobs.completion_logps` on a separately built loss batch), the reference's against
    the policy's, and the seconds and peak memory of that rollout plus one loss step (forward and backward).

    Args:
        model: the policy (in eval mode for the comparisons; its gradients are zeroed afterwards).
        processor: its processor.
        items: collated items with their ``clip``, one per clip.
        args: a GRPO config (template, layout, ``share_video_encoding``, ``num_generations``, sampling knobs).
        engine: a vLLM engine, or None for HF generation.
        reference: the reference model (None: no reference check).
        thresholds: (mean |Δ|, per-token |Δ|, share); None = :data:`LOGP_THRESHOLDS` for the engine and the
            policy's dtype.
    """
    from grounding_rl.models.tokens import completion_token_ids
    from grounding_rl.models.vision import placeholder_token_ids
    from grounding_rl.rollout.generation import SamplingParams, completion_mask, cut_at_tokens
    from grounding_rl.update.logprobs import completion_logps

    G = max(1, int(args.num_generations))
    dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    kind = "hf" if engine is None else "vllm"
    limits = thresholds or LOGP_THRESHOLDS.get((kind, dtype), LOGP_THRESHOLDS[(kind, "bfloat16")])
    params = SamplingParams(args.max_completion_length, args.temperature, args.top_p, args.top_k,
                            args.repetition_penalty)
    token_ids = completion_token_ids(processor.tokenizer, model.generation_config)
    eos, pad = list(token_ids.eos), token_ids.pad
    device = next(model.parameters()).device
    out: list[Check] = []
    for item in items:
        name = str(item["video"]).rsplit("/", 1)[-1]
        grouped = [dict(item) for _ in range(G)]
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        start = time.perf_counter()
        rollout = batching.config_prompt_batch(processor, grouped, args, device)
        inputs = batching.generation_inputs(rollout, grouped)
        if engine is None:
            ids, sampler = sampled_logprobs(model, inputs, params)
        else:
            ids, sampler, prompt_check = _vllm_sample(engine, inputs, params, name, processor)
            out.append(prompt_check)
        rollout_s = time.perf_counter() - start
        mask, _ = completion_mask(ids, eos)
        ids, keep = cut_at_tokens(ids, placeholder_token_ids(model), pad)  # as the trainer's sanitise
        mask = mask * keep
        loss = batching.to_device(batching.prompt_batch(processor, grouped, args.prompt_template,
                                                        video_layout=args.video_layout), device)
        loss.update(completion_ids=ids, completion_mask=mask)
        with torch.no_grad():
            policy = completion_logps(model, loss, args.temperature)
        out.append(compare_logps(f"d.logps {kind}/train", name, sampler.to(policy.device), policy, mask, limits))
        if reference is not None:
            with torch.no_grad():
                ref = completion_logps(reference, loss, args.temperature)
            tolerance = REF_TOLERANCE.get(dtype, REF_TOLERANCE["bfloat16"])
            out.append(compare_logps("d.logps ref/policy", name, ref, policy, mask, (tolerance, tolerance, 0.0)))
        else:
            out.append(Check("d.logps ref/policy", name, True, {}, "not run: no reference model (beta 0)"))
        start = time.perf_counter()
        (completion_logps(model, loss, args.temperature) * mask).sum().backward()
        loss_step_s = time.perf_counter() - start
        model.zero_grad(set_to_none=True)
        key, peak = peak_memory_gib(device)
        out.append(Check("e.cost", name, True, {"rollout_s": rollout_s, "loss_step_s": loss_step_s,
                                                 key: peak, "rows": G, "completion_tokens": int(mask.sum())}))
    return out


def _vllm_sample(engine, inputs: dict, params, clip_name: str, processor):
    """Sample on the vLLM engine from its own processing of the rows' collapsed prompts and clips; returns ``(ids,
    vLLM's log-probs, the (a) check of vLLM's expanded prompt ids against the rollout's)``."""
    from grounding_rl.prompts.preprocessing import CLIPS
    from grounding_rl.rollout.vllm import sampling_kwargs, vllm_prompts

    tokenizer = engine.llm.get_tokenizer()
    prompts, expanded = vllm_prompts(inputs, inputs[CLIPS], engine.family, engine.token_ids,
                                     decode=lambda ids: tokenizer.decode(ids, skip_special_tokens=False))
    seeds = torch.randint(0, 2**31 - 1, (len(prompts),)).tolist()
    sampling = [engine._vllm.SamplingParams(**sampling_kwargs(params), seed=s, stop_token_ids=engine.eos_token_ids)
                for s in seeds]
    outputs = engine.llm.generate(prompts, sampling, use_tqdm=False)
    decode = lambda ids: processor.tokenizer.decode(ids, skip_special_tokens=False)  # noqa: E731
    checks = [compare_ids("a.prompt_ids vllm", clip_name, list(o.prompt_token_ids), want, decode)
              for o, want in zip(outputs, expanded)]
    tokens = [list(o.outputs[0].token_ids) for o in outputs]
    width = max(1, max(len(t) for t in tokens))
    ids = torch.full((len(tokens), width), engine.pad_token_id, dtype=torch.long)
    logps = torch.zeros(len(tokens), width)
    for row, (o, t) in enumerate(zip(outputs, tokens)):
        ids[row, :len(t)] = torch.tensor(t, dtype=torch.long)
        lp = [step[tok].logprob for step, tok in zip(o.outputs[0].logprobs or [], t)]
        logps[row, :len(lp)] = torch.tensor(lp, dtype=torch.float32)
    return ids.to(inputs["input_ids"].device), logps, _first_failure(checks, len(checks), "a.prompt_ids vllm")


def first_batch_checks(trainer) -> list[Check]:
    """(a), (b), (c) on the distinct clips of the trainer's first generation batch, as ``train`` and ``distill``
    run them before the first step: the first ``generation_batch_size`` indices of the default sampler (TRL's
    order, :func:`grounding_rl.data.dataset.resumable_repeat_sampler` with the run's data seed; a recipe's own sampler,
    difficulty or online filter, is not asked, as iterating it may log), decoded by the trainer's collator. Draws
    nothing from the global RNGs (the sampler has its own generator; the states of Python's, NumPy's and torch's are
    restored all the same), so a run with the check is bit-identical to one without."""
    import itertools
    import random

    import numpy as np

    from grounding_rl.data.dataset import resumable_repeat_sampler
    from grounding_rl.update.arguments import data_seed

    args, G = trainer.args, trainer.num_generations
    states = random.getstate(), np.random.get_state()
    with torch.random.fork_rng(devices=[]):
        try:
            sampler = resumable_repeat_sampler(data_source=trainer.train_dataset, mini_repeat_count=G,
                                               batch_size=args.generation_batch_size // G, repeat_count=1,
                                               shuffle=args.shuffle_dataset, seed=data_seed(args))
            first = list(itertools.islice(iter(sampler), args.generation_batch_size))
        finally:
            random.setstate(states[0])
            np.random.set_state(states[1])
    indices = list(dict.fromkeys(int(i) for i in first))
    items = [trainer.data_collator.load_item(i) for i in indices]
    model = trainer.accelerator.unwrap_model(trainer.model)
    return cheap_checks(model, trainer.processing_class, items, trainer.args, trainer.num_generations)
