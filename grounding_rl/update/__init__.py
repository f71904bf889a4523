"""Update: GRPO configuration, loss math, batches and log-probs, the video GRPO trainer, SFT, and what checkpoints hold."""
