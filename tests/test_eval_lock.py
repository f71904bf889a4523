"""One ``eval`` at a time per ``--out``: an OS lock that dies with its process (:mod:`grounding_rl.eval.lock`)."""
import os
import signal
import subprocess
import sys

import pytest

from grounding_rl.errors import UserError
from grounding_rl.eval.lock import LOCK_NAME, lock_output_dir

# Takes the lock the way grounding-rl eval does, says so, then sleeps until killed (no package import: fast).
HOLDER = ("import fcntl, os, sys, time\n"
          "f = open(sys.argv[1], 'a+')\n"
          "fcntl.flock(f.fileno(), fcntl.LOCK_EX)\n"
          "f.seek(0); f.truncate(); f.write(str(os.getpid())); f.flush()\n"
          "print('locked', flush=True)\n"
          "time.sleep(120)\n")


def test_a_second_holder_is_refused_and_a_closed_lock_frees_the_folder(tmp_path):
    out = tmp_path / "ev"
    first = lock_output_dir(out)
    assert (out / LOCK_NAME).read_text().strip() == str(os.getpid())
    with pytest.raises(UserError, match=rf"^--out {out} is in use by another eval \(pid {os.getpid()}\)"):
        lock_output_dir(out)  # flock locks belong to open files: a second open in this process is refused too
    first.close()
    lock_output_dir(out).close()  # the file stays; it no longer blocks
    assert (out / LOCK_NAME).is_file()


def test_eval_on_an_out_held_by_another_process_is_one_line_and_a_kill_frees_it(tmp_path, qwen3_processor_dir,
                                                                                videos_dir, capsys):
    """A second eval is refused before it writes anything; after ``kill -9`` of the holder the folder is free (the
    resume after a killed run still works). The model is the Qwen3-VL config without weights: the lock is taken
    after the checks and before any model loads."""
    from grounding_rl.cli import main as cli

    out = tmp_path / "ev"
    out.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(out / LOCK_NAME)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        assert cli(["eval", "--model", str(qwen3_processor_dir), "--data", str(videos_dir / "annotations.jsonl"),
                    "--out", str(out), "--limit", "1"]) == 2
        err = capsys.readouterr().err.strip()
        assert err == (f"grounding-rl eval: error: --out {out} is in use by another eval (pid {holder.pid}); wait "
                       "for it to end, or give another --out")
        assert sorted(p.name for p in out.iterdir()) == [LOCK_NAME]  # nothing written
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
        holder.stdout.close()
    lock = lock_output_dir(out)  # a stale lock file (its holder killed) does not block
    assert (out / LOCK_NAME).read_text().strip() == str(os.getpid())
    lock.close()
