"""Evaluation and inference: runs, scoring files, metrics reports, pictures and benchmark definitions."""
