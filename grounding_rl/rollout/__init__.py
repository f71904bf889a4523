"""Rollout: the think/answer prompt and G generations per clip."""
