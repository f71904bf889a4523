"""Paths mean what the user typed: a non-editable install (built offline into a throwaway venv that sees the installed
dependencies through a ``.pth`` line), run from a temporary working directory, writes ``train``'s, ``eval``'s and
``infer``'s files under that directory, and nothing inside the installed package or the repository."""
import json
import os
import subprocess
import sys
import sysconfig
import uuid
from pathlib import Path

import pytest

from grounding_rl.paths import REPO_ROOT


def _files(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*") if "__pycache__" not in p.parts}


@pytest.mark.slow
def test_an_installed_package_writes_where_the_user_runs_it(tmp_path, tiny_model_dir, videos_dir, shared):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")  # the installed dependencies, after ours
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1",
               PIP_NO_INDEX="1", GROUNDING_RL_SHARED=str(shared))
    python = str(venv / "bin" / "python")
    src = tmp_path / "src"  # a copy, so the build's own files (build/, *.egg-info) stay out of the repository
    src.mkdir()
    subprocess.run(["cp", "-r", str(REPO_ROOT / "grounding_rl"), str(REPO_ROOT / "pyproject.toml"),
                    str(REPO_ROOT / "README.md"), str(src)], check=True)
    proc = subprocess.run([python, "-m", "pip", "install", "--no-build-isolation", "--no-deps", "--no-index", "-q",
                           str(src)], env=env, capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    work = tmp_path / "work"
    work.mkdir()
    where = subprocess.run([python, "-c", "import grounding_rl; print(grounding_rl.__file__)"], env=env, cwd=work,
                           capture_output=True, text=True, check=True).stdout.strip()
    package = Path(where).parent
    assert package.parent == site  # the installed copy, not the checkout
    before_package, before_repo = _files(package), set(os.listdir(REPO_ROOT))

    cli = str(venv / "bin" / "grounding-rl")
    run_name = f"run-{uuid.uuid4().hex[:8]}"

    def run(*args):
        proc = subprocess.run([cli, *args], env=env, cwd=work, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
        return proc

    data = work / "clips.jsonl"  # a relative --data / train_file
    data.write_text("".join(line + "\n" for line in (videos_dir / "annotations.jsonl").read_text().splitlines()[:2]))
    run("train", "--config", str(REPO_ROOT / "configs" / "tiny_real_clips.yaml"), "--model_name_or_path",
        str(tiny_model_dir), "--train_file", "clips.jsonl", "--video_root", str(videos_dir), "--output_dir",
        f"outputs/{run_name}", "--max_steps", "1", "--max_completion_length", "4")
    assert (work / "outputs" / run_name / "model.safetensors").is_file()
    run("eval", "--model", f"outputs/{run_name}", "--data", "clips.jsonl", "--video-root", str(videos_dir), "--out",
        "ev", "--max-new-tokens", "4", "--num-workers", "0", "--fps", "1", "--max-pixels", "12544")
    assert json.loads((work / "ev" / "metrics.json").read_text())["n"] == 2
    run("infer", "--model", f"outputs/{run_name}", "--video", str(videos_dir / "mmaction2_pool_cleaning.mp4"),
        "--query", "cleaning the pool", "--plot", "timeline.png", "--max-new-tokens", "4", "--fps", "1",
        "--max-pixels", "12544")
    assert (work / "timeline.png").is_file()
    assert _files(package) == before_package  # nothing written inside the installed package
    assert set(os.listdir(REPO_ROOT)) == before_repo and not (REPO_ROOT / "outputs" / run_name).exists()
