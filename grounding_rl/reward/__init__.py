"""Reward: answer parsing, temporal IoU, weighted rewards and evaluation metrics (pure functions)."""
