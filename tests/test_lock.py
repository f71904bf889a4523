"""The locked environments (scripts/lock.sh, scripts/setup.sh): the running .venv holds exactly what its lock pins,
every lock pins every distribution with hashes, and setup.sh refuses a lock made for another platform."""
import os
import re
import shutil
import subprocess
import sys
from importlib.metadata import distributions
from pathlib import Path

import pytest

from grounding_rl.paths import REPO_ROOT

LOCKS = {".venv": REPO_ROOT / "scripts" / "locks" / "venv.txt",
         ".venv-vllm": REPO_ROOT / "scripts" / "locks" / "venv-vllm.txt"}
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)", re.M)


def _norm(name: str) -> str:
    """PEP 503's normalized name: runs of ``-_.`` → ``-``, lower case."""
    return re.sub(r"[-_.]+", "-", name).lower()


def read_lock(path: Path) -> dict[str, str]:
    """``{normalized name: version}`` of a ``uv pip compile`` lock file's ``name==version`` lines."""
    return {_norm(name): version for name, version in PIN.findall(path.read_text())}


def lock_mismatches(installed: dict[str, str], pinned: dict[str, str], own: str = "grounding-rl") -> list[str]:
    """One line per installed distribution that the lock lacks or pins at another version (the project itself
    excepted; a local version label such as torch's ``+cu130`` is not part of the pin)."""
    out = []
    for name, version in sorted(installed.items()):
        if name == own:
            continue
        if name not in pinned:
            out.append(f"{name} {version}: not in the lock")
        elif version.split("+")[0] != pinned[name]:
            out.append(f"{name} {version}: the lock pins {pinned[name]}")
    return out


def test_lock_mismatches_names_each_distribution():
    pinned = {"torch": "2.14.1", "transformers": "5.24.0"}
    installed = {"torch": "2.14.1+cu130", "transformers": "5.25.0", "wandb": "0.30.0", "grounding-rl": "0.1.0"}
    assert lock_mismatches(installed, pinned) == ["transformers 5.25.0: the lock pins 5.24.0",
                                                  "wandb 0.30.0: not in the lock"]


def test_the_running_environment_holds_exactly_its_lock():
    env = Path(sys.prefix).name
    if env not in LOCKS or Path(sys.prefix).parent != REPO_ROOT:
        pytest.skip(f"not one of the checkout's locked environments ({sys.prefix})")
    installed = {_norm(d.metadata["Name"]): d.version for d in distributions()}
    assert lock_mismatches(installed, read_lock(LOCKS[env])) == []


@pytest.mark.parametrize("lock", sorted(LOCKS.values()), ids=lambda p: p.name)
def test_every_pin_is_exact_and_hashed(lock):
    text = lock.read_text()
    assert re.match(r"# platform: python \d+\.\d+, \S+, linux$", text.splitlines()[2]), "line 3: the platform"
    pins = [b for b in re.split(r"\n(?=[A-Za-z0-9])", text) if PIN.match(b)]  # a pin line and its hash lines
    assert len(pins) == len(read_lock(lock)) > 20
    for block in pins:
        assert "--hash=sha256:" in block, block.splitlines()[0]
    assert {"torch", "torchvision", "transformers", "trl", "accelerate", "pip"} <= set(read_lock(lock))


def test_setup_refuses_a_lock_of_another_platform(tmp_path):
    """setup.sh checks the lock's platform line before it creates or touches anything: one line naming both
    platforms and the refresh command, exit 2."""
    (tmp_path / "scripts" / "locks").mkdir(parents=True)
    shutil.copy(REPO_ROOT / "scripts" / "setup.sh", tmp_path / "scripts")
    shutil.copy(REPO_ROOT / "scripts" / "locks" / "install.sh", tmp_path / "scripts" / "locks")
    lines = LOCKS[".venv"].read_text().splitlines(keepends=True)
    lines[2] = "# platform: python 3.99, riscv64, linux\n"
    (tmp_path / "scripts" / "locks" / "venv.txt").write_text("".join(lines))
    env = {**os.environ, "PYTHON": sys.executable}
    proc = subprocess.run(["bash", str(tmp_path / "scripts" / "setup.sh")], capture_output=True, text=True, env=env)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "python 3.99, riscv64, linux" in proc.stderr
    assert f"python {sys.version_info[0]}.{sys.version_info[1]}" in proc.stderr
    assert "bash scripts/lock.sh" in proc.stderr
    assert not (tmp_path / ".venv").exists()
