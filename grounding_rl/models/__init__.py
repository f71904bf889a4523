"""Model helpers: loading Qwen2.5-VL checkpoints and building tiny random-weight models."""
