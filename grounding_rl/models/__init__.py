"""Models: loading checkpoints, merging LoRA, encoding each clip once, and tiny random-weight models."""
