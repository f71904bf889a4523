import subprocess
import sys

from grounding_rl.cli import SUBCOMMANDS, main


def test_help_lists_every_subcommand(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for name in SUBCOMMANDS:
        assert name in out


def test_unknown_subcommand_exits_2(capsys):
    assert main(["nope"]) == 2
    assert "unknown subcommand 'nope'" in capsys.readouterr().err


def test_console_script_runs():
    out = subprocess.run([sys.executable, "-m", "grounding_rl.cli", "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "prepare" in out.stdout
