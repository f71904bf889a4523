"""grounding_rl: GRPO fine-tuning of Qwen2.5-VL for video temporal grounding."""

__version__ = "0.1.0"
