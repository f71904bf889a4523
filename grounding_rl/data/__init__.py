"""Data: annotation readers → canonical samples → frames sampled at an exact fps; the training dataset and clip loading."""
