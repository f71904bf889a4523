"""The error a user's mistake raises, and the one line the ``grounding-rl`` command prints for it.

:class:`UserError` is printed as one line on stderr with exit status 2. :func:`user_message` also turns the errors a
user's input causes elsewhere into that line: a path that is missing, a folder, or not writable (``OSError`` with a
file name), a file that is not UTF-8 (:func:`reading` names the file and byte offset). Programming errors keep their
traceback; ``--debug`` or ``GROUNDING_RL_DEBUG=1`` shows it for user errors too.
"""
from __future__ import annotations

import errno
import os
from contextlib import contextmanager

MAX_LINE = 300  # characters of one error line; longer messages end in an ellipsis with the count cut


class UserError(Exception):
    """A mistake in what the user gave (a path, a config, a flag); the message names the file or flag."""


def excerpt(value, limit: int = 80) -> str:
    """``repr(value)`` cut to ``limit`` characters (the rest counted), for quoting a bad input in one line."""
    text = repr(value.strip() if isinstance(value, str) else value)
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text) - limit} more characters)"


def not_utf8(path: str | os.PathLike) -> UserError:
    """The error for a file that is not UTF-8 text, with the byte offset of the first bad byte."""
    try:
        with open(path, "rb") as handle:
            data = handle.read()
        data.decode("utf-8")
    except UnicodeDecodeError as err:
        return UserError(f"{path}: not UTF-8 text (byte {err.start}: {data[err.start:err.start + 4]!r}); "
                         "convert it, e.g. iconv -f latin1 -t utf-8")
    except OSError:
        pass
    return UserError(f"{path}: not UTF-8 text")


@contextmanager
def reading(path: str | os.PathLike):
    """Turn a ``UnicodeDecodeError`` while reading ``path`` into :func:`not_utf8`'s :class:`UserError`."""
    try:
        yield
    except UnicodeDecodeError:
        raise not_utf8(path) from None


def check_number(flag: str, value, *, minimum=None, maximum=None, above=None, bound: str = "") -> None:
    """Refuse a numeric flag or config value outside its range; None passes (an unset optional value).

    Args:
        flag: the name the user wrote, e.g. ``--max-new-tokens`` or ``max_completion_length``.
        value: the parsed number.
        minimum, maximum: inclusive bounds (None = unbounded).
        above: an exclusive lower bound (``> above``), e.g. 0 for fps and pixels.
        bound: where ``maximum`` comes from, appended to the message (e.g. "the model's context, ...").

    Raises:
        UserError: one line, ``"--batch-size must be ≥ 1 (got 0)"``.
    """
    if value is None:
        return
    if above is not None and not value > above:
        raise UserError(f"{flag} must be > {above} (got {value})")
    if minimum is not None and not value >= minimum:
        raise UserError(f"{flag} must be ≥ {minimum} (got {value})")
    if maximum is not None and not value <= maximum:
        raise UserError(f"{flag} must be ≤ {maximum}{f' ({bound})' if bound else ''} (got {value})")


def _one_line(message: str) -> str:
    line = " ".join(str(message).split())
    if len(line) > MAX_LINE:
        line = f"{line[:MAX_LINE]}… ({len(line) - MAX_LINE} more characters)"
    return line


DISK_ERRNOS = (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)  # no space left, a file-size limit, a quota


def disk_error(err: BaseException) -> str | None:
    """Why a write failed when a full disk, a file-size limit or a quota is the cause (ENOSPC, EFBIG, EDQUOT), else
    None: an ``OSError`` with one of those errno values anywhere in ``err``'s chain (``__cause__``/``__context__``),
    safetensors' error text (``code: 28``) or torch's zip writer failing (``file write failed``, ``iostream error``:
    the errno is lost there; the file-size limit is named when one is set).

    Returns:
        e.g. ``"No space left on device"``, ``"File too large"``.
    """
    import re

    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, OSError) and err.errno in DISK_ERRNOS:
            return os.strerror(err.errno)
        text = str(err)
        code = re.search(r"code: (\d+)", text)
        if code and int(code.group(1)) in DISK_ERRNOS:
            return os.strerror(int(code.group(1)))
        if any(sign in text for sign in TORCH_WRITE_FAILURES):
            return _write_failure()
        err = err.__cause__ or err.__context__
    return None


# What torch.save's zip writer raises when the disk refuses a write (its errno is lost on the way).
TORCH_WRITE_FAILURES = ("file write failed", "iostream error", "unexpected pos")


def _write_failure() -> str:
    """The likely cause of a write that failed without its errno: the file-size limit when one is set."""
    import resource

    limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    if limit != resource.RLIM_INFINITY:
        return f"{os.strerror(errno.EFBIG)}: the file-size limit, ulimit -f, is {limit} bytes"
    return "the write failed: no space left, a file-size limit or a quota"


def user_message(err: BaseException) -> str | None:
    """The one line to print for an error the user caused, or None for a programming error (which must raise).

    Covers :class:`UserError` (and its subclasses such as :class:`grounding_rl.data.samples.AnnotationError`), a full
    disk, file-size limit or quota (:func:`disk_error`; the file named when the writer gave it) and ``OSError`` naming
    a file (missing, a folder, not writable).
    """
    if isinstance(err, UserError):
        return _one_line(str(err))
    why = disk_error(err)
    if why is not None:  # a full disk, a file-size limit or a quota: where, when the writer said
        where = getattr(err, "filename", None) or "a file"
        return _one_line(f"{where}: writing failed ({why}); what was complete is kept: free space and run the same "
                         "command again")
    if isinstance(err, OSError) and getattr(err, "filename", None) is not None:
        return _one_line(f"{err.filename}: {err.strerror or err}")
    return None


def debug_enabled() -> bool:
    """``GROUNDING_RL_DEBUG`` is set to a true value (1, true, yes)."""
    return os.environ.get("GROUNDING_RL_DEBUG", "").lower() in ("1", "true", "yes")
