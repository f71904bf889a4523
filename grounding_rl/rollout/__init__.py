"""Rollout: the one generation path (GRPO rollouts, eval and infer), encoding and prefilling each clip once."""
