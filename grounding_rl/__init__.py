"""grounding_rl: GRPO fine-tuning of Qwen-VL models (Qwen2.5-VL, Qwen3-VL) for video temporal grounding."""

__version__ = "0.1.0"
