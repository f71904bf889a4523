"""The error a user's mistake raises: the ``grounding-rl`` command prints its message as one line on stderr and exits
with status 2 (programming errors keep their traceback)."""


class UserError(Exception):
    """A mistake in what the user gave (a path, a config, a flag); the message names the file or flag."""
