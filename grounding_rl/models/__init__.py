"""Models: loading checkpoints, merging LoRA, encoding each clip once, tiny random-weight models, and the per-GPU
memory a model needs (built on the ``meta`` device)."""
