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

DIFFICULTY_SAMPLING = ("none", "timelens")
# what validation during training logs (with the prefix eval_): the standard scoring, then the reward's clamped one
EVAL_METRICS = ("R1@0.3", "R1@0.5", "R1@0.7", "mIoU", "parse_failure_rate", "format_rate",
                "clamped_R1@0.3", "clamped_R1@0.5", "clamped_R1@0.7", "clamped_mIoU")
# the fields that change which samples a run trains on (in its run fingerprint: a resume must keep them)
DATA_SELECTION_KEYS = ("difficulty_sampling", "difficulty_gaussian_mean", "difficulty_gaussian_std",
                       "difficulty_num_bins", "difficulty_subset_size", "difficulty_duration_edges",
                       "difficulty_range", "online_difficulty_range")


@dataclass
class GroundingGRPOConfig(BaseTrainingArguments, PreprocessingArguments):
    """Configuration of :class:`grounding_rl.update.trainer.GroundingGRPOTrainer`.

    Unknown keys fail in the parser; contradictory values fail in ``__post_init__`` with a message naming the keys.
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
    vllm_importance_sampling_correction: bool = field(
        default=True,
        metadata={
            "help": "Whether to apply Importance Sampling (IS) to correct for the mismatch between vLLM "
            "completion logprobs and recomputed training logprobs. If set to `False`, no IS is applied "
            "regardless of `vllm_importance_sampling_mode`."
        },
    )
    vllm_importance_sampling_mode: str = field(
        default="sequence_mask",
        metadata={
            "help": "How IS is performed when vllm_importance_sampling_correction=True: 'token_truncate', "
            "'token_mask', 'sequence_truncate' or 'sequence_mask' (truncate: clip the ratio to [C_min, C_max]; "
            "mask: set ratios outside it to zero; token: one ratio per token; sequence: one per completion)."
        },
    )
    vllm_importance_sampling_clip_max: float | None = field(
        default=3.0,
        metadata={"help": "Importance sampling upper bound C_max used by `vllm_importance_sampling_mode`."},
    )
    vllm_importance_sampling_clip_min: float | None = field(
        default=None,
        metadata={"help": "Importance sampling lower bound C_min used by `vllm_importance_sampling_mode`."},
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
    # --- recipes: dynamic sampling (DAPO) and ground-truth-guided groups (TempSamp-R1)
    dynamic_sampling: bool = field(
        default=False,
        metadata={
            "help": "DAPO's dynamic sampling (arXiv 2503.14476, Algorithm 1): groups whose G rewards are all equal "
            "carry no gradient, so further generation batches are drawn until every process holds as many groups "
            "with non-zero reward std as one generation batch has, or `max_num_gen_batches` batches were drawn; "
            "surplus groups are discarded, and a shortfall is filled with zero-std groups that are masked out of the "
            "loss. All processes draw the same number of batches (the decision is a global minimum), so ZeRO-3 "
            "never waits. Needs each process's rows (per_device_train_batch_size × steps_per_generation) to hold "
            "whole groups. Extra batches are drawn at random from the training set, seeded by the step."
        },
    )
    max_num_gen_batches: int = field(
        default=4,
        metadata={
            "help": "With `dynamic_sampling`: at most this many generation batches per generation, the first "
            "included (verl's `algorithm.filter_groups.max_num_gen_batches`, used by DAPO's recipe; ≥ 1)."
        },
    )
    use_gt_injection: bool = field(
        default=False,
        metadata={
            "help": "TempSamp-R1's ground-truth-guided groups (arXiv 2509.18056; ZhangZikun6666/TempSamp-R1 "
            "`algorithm.use_gt_injection`, `gt_replace_index` -1): the last completion of every group is replaced by "
            "the ground-truth interval written in the template's answer format (with a think block where the "
            "template asks for one) and scored like the others; it joins its group's mean and std. Its log-probs "
            "are computed by the policy (π_old = the policy at generation time), never sampled. Logged reward "
            "means cover the sampled completions only (TempSamp-R1's `gt_log_exclude`)."
        },
    )
    reward_shaping: str = field(
        default="none",
        metadata={
            "help": "`tempsamp`: TempSamp-R1's non-linear shaping of the `iou` reward of every completion (before the "
            "weighted sum; grounding_rl.reward.shaping.tempsamp_shaping), meant for `use_gt_injection`; `none`."
        },
    )
    reward_shaping_threshold: float = field(
        default=0.8, metadata={"help": "τ of `reward_shaping: tempsamp` (TempSamp-R1's default 0.8)."}
    )
    reward_shaping_alpha: float = field(
        default=1.0, metadata={"help": "α of `reward_shaping: tempsamp` (TempSamp-R1's default 1.0)."}
    )

    reward_funcs: list[str] = field(
        default_factory=lambda: ["iou", "format"],
        metadata={"help": "Reward functions: registered names (iou, format, tiou, or added with grounding_rl.reward.rewards.register_reward), module:function, or path/to/file.py:function."},
    )

    # --- difficulty-aware data and validation during training (ours; each field names its source) --------------
    # Scores come from `grounding-rl difficulty` (each train_file line's "difficulty": {"iou", ...}); the math is in
    # grounding_rl/data/difficulty.py. Validation runs the greedy evaluation of `grounding-rl eval` on eval_file.
    difficulty_sampling: str = field(
        default="none",
        metadata={"help": "'timelens': train on TimeLens's difficulty-weighted subset (TencentARC/TimeLens "
                          "training/data/grounding.py): difficulty_subset_size samples drawn once, without "
                          "replacement, seeded by `seed`, with weight exp(-0.5((iou - mean)/std)^2) / (count of its "
                          "IoU bin + 1e-6). 'none': every sample. Needs the train_file's difficulty scores."},
    )
    difficulty_gaussian_mean: float = field(
        default=0.05, metadata={"help": "Centre of TimeLens's IoU Gaussian (its train_scripts/run_grpo_qwen3_8b.sh: "
                                        "--gaussian_filter_mean 0.05, favouring hard samples)."})
    difficulty_gaussian_std: float = field(
        default=0.2, metadata={"help": "Width of TimeLens's IoU Gaussian (its script: --gaussian_filter_std 0.2)."})
    difficulty_num_bins: int = field(
        default=20, metadata={"help": "Inverse-density IoU bins on [0, 1] (TimeLens's fixed_gaussian_sampling: 20, "
                                      "set by its script); 0 = the Gaussian weight alone."})
    difficulty_subset_size: int = field(
        default=2500, metadata={"help": "Samples TimeLens's draw keeps (its script: --target_size 2500); at least "
                                        "the training set's size keeps every sample (a warning says so)."})
    difficulty_duration_edges: list[float] | None = field(
        default=None,
        metadata={"help": "Duration strata of the draw in seconds, the subset split evenly over [0, e1], [e1, e2], "
                          "..., [ek, inf) (TimeLens's training/data/hybrid.py: 30 60 90 120 150 180 210 240). None = "
                          "one stratum."},
    )
    difficulty_range: list[float] | None = field(
        default=None,
        metadata={"help": "Offline range filter [low, high]: train only on samples whose scored IoU is in (low, high] "
                          "(xiaomi-research/time-r1 src/utils/process_data.py keeps (0, 0.7]: [0.0, 0.7]). Applied "
                          "before difficulty_sampling. None = off."},
    )
    online_difficulty_range: list[float] | None = field(
        default=None,
        metadata={"help": "Online range filter [low, high]: after each epoch, drop the samples whose mean IoU reward "
                          "(the 'iou' reward, else 'tiou') over that epoch's completions is outside (low, high] "
                          "(Time-R1's per-epoch filtering, scripts/posttrain/train_rl_SF.sh: [0.0, 0.7]). Epochs keep "
                          "their length, cycling the kept samples. No scores needed. None = off."},
    )
    eval_file: str | None = field(
        default=None,
        metadata={"help": "Canonical JSONL evaluated greedily during training (the code of `grounding-rl eval`) with "
                          "eval_strategy steps/epoch; logs eval_R1@0.3/0.5/0.7, eval_mIoU (standard scoring), "
                          "eval_clamped_* and the parse-failure and format rates; metric_for_best_model (default mIoU "
                          "with load_best_model_at_end) picks the best checkpoint. Relative videos resolve against "
                          "video_root."},
    )
    eval_max_samples: int | None = field(
        default=None, metadata={"help": "Evaluate only the first N samples of eval_file; None = all."})

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
        problems += self.difficulty_problems()
        try:
            from grounding_rl.reward.rewards import get_reward_funcs

            get_reward_funcs(self.reward_funcs)
        except ValueError as err:
            problems.append(f"reward_funcs: {err}")
        if self.reward_weights is not None and len(self.reward_weights) != len(self.reward_funcs):
            problems.append(f"reward_weights has {len(self.reward_weights)} values for {len(self.reward_funcs)} "
                            f"reward_funcs {self.reward_funcs}")
        from grounding_rl.reward.shaping import SHAPINGS

        if self.reward_shaping not in SHAPINGS:
            problems.append(f"reward_shaping {self.reward_shaping!r} is not one of {SHAPINGS}")
        elif self.reward_shaping != "none" and "iou" not in self.reward_funcs:
            problems.append(f"reward_shaping {self.reward_shaping!r} shapes the 'iou' reward, which reward_funcs "
                            f"{self.reward_funcs} lacks")
        if self.reward_shaping_alpha <= 0:
            problems.append(f"reward_shaping_alpha must be > 0 (got {self.reward_shaping_alpha})")
        if self.max_num_gen_batches < 1:
            problems.append(f"max_num_gen_batches must be ≥ 1 (got {self.max_num_gen_batches})")
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
        from grounding_rl.update.grpo import IMPORTANCE_SAMPLING_MODES

        problems = []
        if self.vllm_importance_sampling_mode not in IMPORTANCE_SAMPLING_MODES:
            problems.append(f"vllm_importance_sampling_mode {self.vllm_importance_sampling_mode!r} is not one of "
                            f"{IMPORTANCE_SAMPLING_MODES}")
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

    def difficulty_problems(self) -> list[str]:
        """What is wrong with the difficulty and validation fields (one message each)."""
        problems = []
        if self.difficulty_sampling not in DIFFICULTY_SAMPLING:
            problems.append(f"difficulty_sampling {self.difficulty_sampling!r} is not one of {DIFFICULTY_SAMPLING}")
        if self.difficulty_gaussian_std <= 0 or self.difficulty_num_bins < 0 or self.difficulty_subset_size < 1:
            problems.append(f"difficulty_gaussian_std > 0, difficulty_num_bins ≥ 0 and difficulty_subset_size ≥ 1 "
                            f"required (got {self.difficulty_gaussian_std}, {self.difficulty_num_bins}, "
                            f"{self.difficulty_subset_size})")
        edges = self.difficulty_duration_edges
        if edges and (any(e <= 0 for e in edges) or list(edges) != sorted(set(edges))):
            problems.append(f"difficulty_duration_edges must be increasing seconds > 0 (got {edges})")
        for key in ("difficulty_range", "online_difficulty_range"):
            value = getattr(self, key)
            if value is not None and (len(value) != 2 or not 0.0 <= value[0] < value[1] <= 1.0):
                problems.append(f"{key} must be [low, high] with 0 ≤ low < high ≤ 1 (got {value})")
        evaluating = str(getattr(self.eval_strategy, "value", self.eval_strategy)) != "no" or self.eval_on_start
        if evaluating and not self.eval_file:
            problems.append(f"eval_strategy {str(getattr(self.eval_strategy, 'value', self.eval_strategy))!r} needs "
                            "eval_file (a canonical JSONL to evaluate greedily during training)")
        if evaluating and self.world_size > 1:
            problems.append(f"validation during training (eval_strategy) runs on one process only, not "
                            f"{self.world_size}: a 2-process ZeRO-3 run stalled at its first evaluation; evaluate the "
                            "checkpoints with `grounding-rl eval` (multi-process, resumable) instead")
        if self.eval_file and not evaluating:
            problems.append("eval_file is set but eval_strategy is 'no': set eval_strategy: steps and eval_steps")
        if self.eval_max_samples is not None and self.eval_max_samples < 1:
            problems.append(f"eval_max_samples must be ≥ 1 (got {self.eval_max_samples})")
        metric = self.metric_for_best_model
        if metric is not None and metric.removeprefix("eval_") not in EVAL_METRICS:
            problems.append(f"metric_for_best_model {metric!r} is not an evaluation metric of GRPO training; one of "
                            f"{list(EVAL_METRICS)}")
        return problems

    def grounding_config(self) -> GroundingConfig:
        """What evaluation and inference must reuse, saved as ``grounding_config.json`` with every checkpoint."""
        return GroundingConfig(
            prompt_template=self.prompt_template,
            video=self.video_settings,
            reward_funcs=list(self.reward_funcs),
            reward_weights=None if self.reward_weights is None else list(self.reward_weights),
            video_layout=self.video_layout,
        )
