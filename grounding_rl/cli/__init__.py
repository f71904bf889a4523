"""The ``grounding-rl`` command: the entry layer on top of the stages. Every subcommand is a module of this package
exposing ``main(argv) -> int`` (its argument parser lives there too; the work it calls lives in the stages);
``train`` and ``sft`` share :mod:`grounding_rl.cli.common`.

Modules are imported only when their subcommand runs, so ``grounding-rl --help`` is instant. A user's mistake raised
by any subcommand (:func:`grounding_rl.errors.user_message`: a :class:`grounding_rl.errors.UserError`, a path that is
missing or not writable, a file that is not UTF-8) is printed as one line on stderr with exit status 2; ``--debug`` or
``GROUNDING_RL_DEBUG=1`` shows its traceback instead. Programming errors always raise.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys

# name -> (module, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "prepare": ("grounding_rl.cli.prepare", "convert benchmark annotations to canonical JSONL"),
    "score": ("grounding_rl.cli.score", "score predictions against annotations (R1@m, mIoU)"),
    "train": ("grounding_rl.cli.train", "GRPO training (--config X.yaml plus --key value overrides)"),
    "distill": ("grounding_rl.cli.distill",
                "on-policy distillation from a teacher model (--config X.yaml plus --key value overrides)"),
    "sft": ("grounding_rl.cli.sft", "supervised warm start on the answer format (--config X.yaml ...)"),
    "check": ("grounding_rl.cli.check",
              "before a long run: do rollout and training see the same video tokens, times, positions, log-probs"),
    "merge-lora": ("grounding_rl.cli.merge_lora", "merge a LoRA checkpoint into full weights"),
    "fits": ("grounding_rl.cli.fits", "per-GPU memory a recipe needs (weights, gradients, optimizer, activations)"),
    "eval": ("grounding_rl.cli.eval", "evaluate a checkpoint on a canonical JSONL"),
    "difficulty": ("grounding_rl.cli.difficulty",
                   "score each training sample's IoU under a model (greedy eval) for difficulty-aware GRPO"),
    "infer": ("grounding_rl.cli.infer", "ask when something happens in a video"),
    "baseline": ("grounding_rl.cli.baseline", "predict the training set's mean normalized interval (a prior)"),
    "compare": ("grounding_rl.cli.compare", "one table of several runs' metrics"),
    "plot": ("grounding_rl.cli.plot", "training curves of one or more runs (reward, IoU, KL, length, timings)"),
    "tiny-model": ("grounding_rl.cli.tiny_model",
                   "build a random-weight tiny Qwen-VL model (--like FOLDER) for tests and the demo"),
    "demo-data": ("grounding_rl.cli.demo_data", "write procedural demo clips and splits"),
    "demo-results": ("grounding_rl.cli.demo_results", "record a demo run's table in docs/demo_results.json"),
}


GRACEFUL = ("train", "sft", "distill")  # subcommands that stop at a checkpoint on SIGTERM, SIGUSR1 and SIGINT


def _leave_now(status: int) -> None:
    """End a training process of several at once, its files written and its process group destroyed: flush, then
    ``os._exit`` without the interpreter's teardown, where a communicator's C++ thread still running can abort the
    process ("terminate called without an active exception", SIGABRT: the launcher then reports the finished run as
    failed; seen once in 2-process ZeRO-3 CPU runs under load)."""
    import logging

    sys.stdout.flush()
    sys.stderr.flush()
    logging.shutdown()
    os._exit(status)


def _usage() -> str:
    lines = ["usage: grounding-rl SUBCOMMAND [options]   (grounding-rl SUBCOMMAND --help for its options)", "",
             "Video temporal grounding with GRPO on Qwen2.5-VL and Qwen3-VL.", "", "subcommands:"]
    lines += [f"  {name:<12} {help_}" for name, (_, help_) in SUBCOMMANDS.items()]
    return "\n".join(lines)


@contextlib.contextmanager
def _one_line_usage_errors():
    """While a subcommand runs, an argument its parser refuses (an unknown choice, ``--gt abc``, a required flag
    left out; ``argparse.ArgumentParser.error``, also TRL's parser and a subcommand's own ``parser.error``) raises a
    :class:`grounding_rl.errors.UserError` naming the flag, printed as the one error line, instead of argparse's usage
    block and error (20 lines for ``infer``); ``SUBCOMMAND --help`` still prints the usage."""
    from grounding_rl.errors import UserError

    original = argparse.ArgumentParser.error

    def error(parser, message):
        raise UserError(f"{message} ({parser.prog} --help lists the options)")

    argparse.ArgumentParser.error = error
    try:
        yield
    finally:
        argparse.ArgumentParser.error = original


def main(argv: list[str] | None = None) -> int:
    """Run ``grounding-rl SUBCOMMAND …``; ``--debug`` (anywhere, or ``GROUNDING_RL_DEBUG=1``) lets user errors raise
    with their traceback. Returns the exit status: the subcommand's, or 2 for a user error
    (:func:`grounding_rl.errors.user_message`), for no subcommand (the usage on stderr) and for an unknown one (one
    line, with the closest subcommand: ``evaluate`` → "did you mean 'eval'?")."""
    argv = list(sys.argv[1:] if argv is None else argv)
    from grounding_rl.errors import debug_enabled, user_message

    debug = "--debug" in argv or debug_enabled()
    argv = [a for a in argv if a != "--debug"]
    if not argv:  # a command line missing its subcommand is a mistake: the usage, on stderr, exit 2
        print(_usage(), file=sys.stderr)
        return 2
    if argv[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0
    if argv[0] in ("-V", "--version"):
        from grounding_rl import __version__

        print(__version__)
        return 0
    name, rest = argv[0], argv[1:]
    if name not in SUBCOMMANDS:
        import difflib

        close = difflib.get_close_matches(name, SUBCOMMANDS, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        print(f"grounding-rl: error: unknown subcommand {name!r}{hint} (grounding-rl --help lists them)",
              file=sys.stderr)
        return 2
    from grounding_rl.cli.quiet import quiet_third_party
    from grounding_rl.stopping import Interrupted, exit_code, stop_signals

    quiet_third_party()  # stdout carries only the command's output

    # training stops gracefully itself (cli.common.train_and_finish); the other commands stop at once
    stops = contextlib.nullcontext() if name in GRACEFUL else stop_signals(f"grounding-rl {name}", graceful=False)
    try:
        module = importlib.import_module(SUBCOMMANDS[name][0])
        with _one_line_usage_errors(), stops:
            status = int(module.main(rest) or 0)
        if name in GRACEFUL and int(os.environ.get("WORLD_SIZE", "1")) > 1:
            _leave_now(status)
        return status
    except KeyboardInterrupt:  # Ctrl-C in a training command before its graceful stop took over (setup, loading)
        import signal

        when = "before training started" if name in GRACEFUL else "at once"
        print(f"grounding-rl {name}: stopped by SIGINT {when}; run the same command again", file=sys.stderr)
        return exit_code(signal.SIGINT)
    except Interrupted as stop:
        print(f"grounding-rl {name}: stopped by {stop}; what was finished is kept (eval and difficulty write each "
              "prediction as it comes): run the same command again to go on", file=sys.stderr)
        return exit_code(stop.signum)
    except Exception as err:  # noqa: BLE001 - only user errors are caught; the rest re-raise below
        message = user_message(err)
        if message is None or debug:
            raise
        print(f"grounding-rl {name}: error: {message}", file=sys.stderr)
        return 2
