"""Evaluation and inference: the training preprocessing, greedy decoding, metrics, reports and pictures."""
