"""Reading and writing the JSONL files this package uses (canonical samples, predictions, scored data files), one
object per line, with one error policy.

:class:`JsonLines` reads a file in one of two modes:

* ``refuse`` (the default): a line that is not UTF-8, not JSON or not a JSON object is the user's mistake, raised as
  one :class:`JsonlError` naming ``FILE:LINE`` (the ``grounding-rl`` command prints it, exit 2);
* ``count``: such lines are skipped and counted in :attr:`JsonLines.skipped`, for files where a torn last line is
  expected — a ``predictions.jsonl`` written line by line by a run that was killed. The caller reports the count; a
  skipped line is never silent.

Files are read as ``utf-8-sig`` (a byte-order mark is skipped) and blank lines are ignored. :func:`write_jsonl_atomic`
writes a whole file atomically (a temporary file in the same folder, then ``os.replace``) with the permissions
``open()`` would give it; :class:`JsonlAppender` appends flushed lines to a file that a killed writer may have left
without its last newline.
"""
from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

from grounding_rl.errors import UserError, disk_error
from grounding_rl.paths import follow_umask

REFUSE, COUNT = "refuse", "count"
MODES = (REFUSE, COUNT)
_BOM = b"\xef\xbb\xbf"


class JsonlError(UserError, ValueError):
    """A JSONL line that is not UTF-8, not JSON or not an object (the message names ``FILE:LINE``)."""


def lone_surrogate(value) -> str | None:
    """The first lone surrogate in the strings of a parsed JSON value (a ``\\ud800`` escape without its other half,
    which JSON allows but UTF-8 cannot write), as ``"a lone surrogate \\ud800"``; None when there is none."""
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as err:
        return f"a lone surrogate \\u{ord(err.object[err.start]):04x}"
    return None


class JsonLines:
    """The objects of a JSONL file: ``for number, row in JsonLines(path): ...`` yields ``(1-based line number, dict)``.

    Args:
        path: the file (``OSError`` naming it when it cannot be opened).
        mode: :data:`REFUSE` or :data:`COUNT` (see the module docstring).

    Attributes:
        skipped: lines skipped so far (``count`` mode only; 0 in ``refuse`` mode).

    Raises:
        JsonlError: in ``refuse`` mode, the first bad line: ``"a.jsonl:3: not valid JSON (Expecting value)"``.
        ValueError: an unknown ``mode``.
    """

    def __init__(self, path: str | os.PathLike, mode: str = REFUSE):
        if mode not in MODES:
            raise ValueError(f"unknown JSONL mode {mode!r}; known: {list(MODES)}")
        self.path, self.mode, self.skipped = path, mode, 0

    def _bad(self, number: int, why: str) -> None:
        if self.mode == REFUSE:
            raise JsonlError(f"{self.path}:{number}: {why}")
        self.skipped += 1

    def __iter__(self) -> Iterator[tuple[int, dict]]:
        with open(self.path, "rb") as handle:
            for number, raw in enumerate(handle, 1):
                if number == 1:
                    raw = raw.removeprefix(_BOM)
                if not raw.strip():
                    continue
                try:
                    row = json.loads(raw.decode("utf-8"))
                except UnicodeDecodeError as err:
                    self._bad(number, f"not UTF-8 text (byte {err.start} of the line: {raw[err.start:err.start + 4]!r}"
                                      "); convert the file, e.g. iconv -f latin1 -t utf-8")
                    continue
                except json.JSONDecodeError as err:
                    self._bad(number, f"not valid JSON ({err.msg})")
                    continue
                if not isinstance(row, dict):
                    self._bad(number, f"expected a JSON object, got {type(row).__name__}")
                    continue
                if b"\\u" in raw and lone_surrogate(row):
                    self._bad(number, f"{lone_surrogate(row)}: not valid Unicode text (half of a character)")
                    continue
                yield number, row


def read_jsonl_objects(path: str | os.PathLike, mode: str = REFUSE) -> tuple[list[dict], int]:
    """``(objects in file order, lines skipped)`` of a JSONL file (:class:`JsonLines`)."""
    lines = JsonLines(path, mode)
    rows = [row for _, row in lines]
    return rows, lines.skipped


def write_jsonl_atomic(path: str | os.PathLike, rows: Iterable[dict | str]) -> int:
    """Write one JSON object per line (a string as it is, then a newline: a report's lines), atomically; the folder
    is created. UTF-8 text is kept as is (``ensure_ascii=False``). Returns the number of lines written."""
    path = os.path.abspath(path)
    folder = os.path.dirname(path)
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
    count = 0
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            for row in rows:
                handle.write((row if isinstance(row, str) else json.dumps(row, ensure_ascii=False)) + "\n")
                count += 1
            handle.flush()
            os.fsync(handle.fileno())
        follow_umask(tmp)  # mkstemp creates 0600; give the file the usual permissions
        os.replace(tmp, path)
    except BaseException as err:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(err, OSError) and err.filename is None:  # a failed write names no file: name the one meant
            raise OSError(err.errno, err.strerror, str(path)) from err
        raise
    return count


class JsonlAppender:
    """Appends one flushed JSON line per object to ``path``; first ends a last line that a killed writer left without
    its newline (that torn line is then skipped, and counted, by :class:`JsonLines` in ``count`` mode). ``default``:
    ``json.dumps``'s, for objects JSON has no type for (e.g. ``str``)."""

    def __init__(self, path: str | os.PathLike, default=None):
        path, self.default = Path(path), default
        needs_newline = path.is_file() and path.stat().st_size > 0 and path.read_bytes()[-1:] != b"\n"
        self.handle = open(path, "a", encoding="utf-8")
        if needs_newline:
            self.handle.write("\n")

    def write(self, *rows: dict) -> None:
        """Append ``rows`` and flush.

        Raises:
            UserError: the disk is full, or a file-size limit or quota is reached
                (:func:`grounding_rl.errors.disk_error`): the file is cut back to its last complete row first, so it
                holds only complete rows, and the message names the file.
        """
        text = "".join(json.dumps(row, ensure_ascii=False, default=self.default) + "\n" for row in rows)
        start = self.handle.tell()
        try:
            self.handle.write(text)
            self.handle.flush()
        except OSError as err:
            why = disk_error(err)
            if why is None:
                raise
            self._cut_back(start)
            raise UserError(f"{self.handle.name}: writing a row failed ({why}); the rows before it are kept: free "
                            "space and run the same command again to go on") from err

    def _cut_back(self, size: int) -> None:
        """Drop what a failed write left after byte ``size`` (Python's buffer too)."""
        descriptor = os.dup(self.handle.fileno())
        try:
            self.handle.close()
        except OSError:
            pass  # the close re-tries the buffered write, which fails again
        try:
            os.ftruncate(descriptor, size)
        finally:
            os.close(descriptor)
        self.handle = open(self.handle.name, "a", encoding="utf-8")

    def close(self) -> None:
        self.handle.close()
