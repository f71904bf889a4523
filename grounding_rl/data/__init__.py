"""Data: annotation readers → canonical samples → frames sampled at an exact fps → processor inputs."""
