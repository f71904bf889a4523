import subprocess
import sys

import pytest

from grounding_rl.cli import SUBCOMMANDS, main


def test_help_lists_every_subcommand(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for name in SUBCOMMANDS:
        assert name in out


def test_unknown_subcommand_exits_2(capsys):
    assert main(["nope"]) == 2
    assert capsys.readouterr().err == ("grounding-rl: error: unknown subcommand 'nope' (grounding-rl --help lists "
                                       "them)\n")
    assert main(["evaluate"]) == 2
    assert capsys.readouterr().err == ("grounding-rl: error: unknown subcommand 'evaluate'; did you mean 'eval'? "
                                       "(grounding-rl --help lists them)\n")


def test_no_subcommand_is_the_usage_on_stderr_and_exit_2(capsys):
    assert main([]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.startswith("usage: grounding-rl SUBCOMMAND")


def test_console_script_runs():
    out = subprocess.run([sys.executable, "-m", "grounding_rl.cli", "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "prepare" in out.stdout


@pytest.mark.parametrize("sub", ["train", "sft"])
def test_config_mistakes_are_one_line_and_exit_2(sub, tmp_path, capsys):
    """``--config`` without a path, or a path to no file: one stderr line naming it, exit 2, no traceback (in this
    process: the entry point's own exit code; test_console_script_runs covers ``python -m grounding_rl.cli``)."""
    for args, expected in ((["--config"], "--config needs the path"),
                           (["--config", str(tmp_path / "nope.yaml")], "nope.yaml: no such config file")):
        assert main([sub, *args]) == 2
        err = capsys.readouterr().err
        lines = err.strip().splitlines()
        assert len(lines) == 1 and expected in lines[0], err
        assert "Traceback" not in err


@pytest.mark.parametrize("sub", ["merge-lora", "fits", "compare", "tiny-model", "demo-data", "distill"])
def test_help_is_plain_text_and_whole(sub, capsys):
    """--help of the dev tools, compare, fits, merge-lora and distill: no reST markup, a description ending in a full
    stop, every option with help; distill's example is a distillation recipe."""
    with pytest.raises(SystemExit) as exit_info:
        main([sub, "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "``" not in out and ":func:" not in out and ":mod:" not in out
    description = out.split("\n\n")[1]
    assert description.rstrip().endswith((".", ":")), description
    if sub == "distill":
        assert "--config configs/qwen2_5_vl_7b_to_3b_distill.yaml" in out
    if sub == "tiny-model":
        options = out.split("options:")[1]
        for flag in ("--from-config", "--overwrite", "--hidden-size", "--vision-heads", "--seed"):
            assert flag in options
        from grounding_rl.cli.tiny_model import SIZE_HELP

        assert all(text.split()[0] in options for text in SIZE_HELP.values())


def test_a_run_unlike_its_starting_checkpoints_prompt_is_warned(tmp_path, caplog):
    """GRPO from an SFT warm start saved with prompt_template 'timezero' while the YAML says (or defaults to)
    'default': it trained on without a word. Now one warning names both values; agreeing or a base model: none."""
    from types import SimpleNamespace

    from grounding_rl.cli.common import warn_unlike_the_checkpoint
    from grounding_rl.data.video import VideoSettings
    from grounding_rl.prompts.preprocessing import GroundingConfig

    GroundingConfig(prompt_template="timezero", video=VideoSettings()).save(tmp_path)
    model = SimpleNamespace(model_name_or_path=str(tmp_path))
    run = SimpleNamespace(prompt_template="default", video_layout="released")
    with caplog.at_level("WARNING", logger="grounding_rl.cli"):
        message = warn_unlike_the_checkpoint(model, run)
    assert message == (f"this run's prompt differs from the one {tmp_path} was trained with (its "
                       "grounding_config.json): prompt_template 'default' (the checkpoint's: 'timezero'); set the "
                       "checkpoint's value to continue in its format")
    assert [r.getMessage() for r in caplog.records] == [message]
    agreeing = SimpleNamespace(prompt_template="timezero", video_layout="released")
    assert warn_unlike_the_checkpoint(model, agreeing) is None
    assert warn_unlike_the_checkpoint(SimpleNamespace(model_name_or_path="Qwen/Qwen2.5-VL-3B-Instruct"), run) is None
