"""The rollout engine a GRPO run samples with, built from its config: :class:`grounding_rl.rollout.vllm.VLLMEngine`
with ``use_vllm`` (TRL's colocate mode and ``vllm_*`` knobs), else :class:`grounding_rl.rollout.generation.
HFGenerateEngine`. The engines live in ``rollout``; reading the GRPO config to choose and build one is training's.
"""
from __future__ import annotations

from grounding_rl.models.tokens import completion_token_ids
from grounding_rl.rollout.generation import HFGenerateEngine, RolloutEngine


def make_rollout_engine(args, accelerator, model, processor) -> RolloutEngine:
    """The engine ``args`` (a :class:`grounding_rl.update.config.GroundingGRPOConfig`) asks for; with ``use_vllm`` a
    :class:`grounding_rl.rollout.vllm.VLLMEngine` on the policy's checkpoint from the config's TRL knobs
    (``vllm_*``), its prompt + completion budget ``vllm_max_model_length``, else ``max_prompt_length`` (8192 when
    unset) + ``max_completion_length``.

    Args:
        args: the GRPO config (``use_vllm``, ``vllm_*``, ``ds3_gather_for_generation``,
            ``gradient_checkpointing_kwargs``).
        accelerator: the trainer's ``accelerate.Accelerator``.
        model: the (wrapped) policy; its checkpoint is what vLLM loads first.
        processor: its processor (EOS and pad ids).
    """
    if not getattr(args, "use_vllm", False):
        return HFGenerateEngine(accelerator, args.ds3_gather_for_generation, args.gradient_checkpointing_kwargs)
    from grounding_rl.rollout.vllm import VLLMEngine
    from grounding_rl.update.recipes import active_recipes, each

    unwrapped = accelerator.unwrap_model(model)
    base = getattr(unwrapped, "get_base_model", lambda: unwrapped)()
    ids = completion_token_ids(processor.tokenizer, unwrapped.generation_config)
    length = args.vllm_max_model_length or ((args.max_prompt_length or 8192) + args.max_completion_length)
    return VLLMEngine(base.config._name_or_path, ids.eos, ids.pad, dtype=str(unwrapped.dtype).removeprefix("torch."),
                      max_model_len=length, gpu_memory_utilization=args.vllm_gpu_memory_utilization,
                      tensor_parallel_size=args.vllm_tensor_parallel_size,
                      enable_sleep_mode=args.vllm_enable_sleep_mode, seed=args.seed,
                      logps_need_correcting=any(r.name == "vllm_importance_sampling" for r in active_recipes(args)),
                      accelerator=accelerator, max_videos=1 + max(each(args, "extra_videos"), default=0))
