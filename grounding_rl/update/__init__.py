"""Update: GRPO configuration, loss math and the video GRPO trainer."""
