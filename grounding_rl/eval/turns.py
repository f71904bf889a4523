"""Evaluating the policy with the crop tool (``eval`` / ``infer --max-tool-calling-iterations K``, alias
``--max-turns``): what may run (:func:`check_turns_run`) and what it did (:func:`turns_summary`). The conversations
themselves are answered by :mod:`grounding_rl.rollout.answering` with the multi-turn loop of training
(:func:`grounding_rl.rollout.conversation.run_conversations`), greedy, each model turn up to ``max_new_tokens``
tokens, at most K crop requests per query; the final turn is the prediction (absolute seconds), and each record keeps
its conversation (``turns``, the requested ``windows``, ``calls``, ``failures``).
"""
from __future__ import annotations

from grounding_rl.errors import UserError


def check_turns_run(max_turns: int, zoom: bool, sampler: str, prompt_template: str) -> None:
    """Raises UserError (one line) when ``--max-tool-calling-iterations`` cannot run: below 0, with ``--zoom``, a
    sampler other than ``exact`` (windows sampled exactly) or a template asking for a set of intervals; both engines."""
    from grounding_rl.rollout.tools import ToolSettings
    from grounding_rl.rollout.zoom import window_problems

    ToolSettings(max_turns)  # refuses K < 0
    if max_turns and zoom:
        raise UserError("--max-tool-calling-iterations and --zoom are two ways to look again; give one")
    problems = window_problems("--max-tool-calling-iterations", sampler, prompt_template, "the crop tool is for one")
    if max_turns and problems:
        raise UserError(problems[0])


def turns_summary(records: list[dict]) -> dict:
    """What the crop tool did over a run's records (``metrics.json`` ``turns``): ``{"queries", "turns_mean",
    "call_frequency", "failure_frequency", "coverage"}`` — queries with a conversation, model turns per query, crop
    requests per query, refused / requested (TRL's definitions), and the mean share of the ground truth inside the
    last sampled window (over queries that sampled one; None if none did)."""
    from grounding_rl.reward.window import window_coverage

    talked = [r for r in records if r.get("conversation")]
    calls = sum(r["conversation"]["calls"] for r in talked)
    covered = [window_coverage(r["conversation"]["windows"][-1], (r["gt_start"], r["gt_end"]))
               for r in talked if r["conversation"]["windows"]]
    n = max(len(talked), 1)
    return {"queries": len(talked),
            "turns_mean": round(sum(len(r["conversation"]["turns"]) for r in talked) / n, 4),
            "call_frequency": round(calls / n, 4),
            "failure_frequency": round(sum(r["conversation"]["failures"] for r in talked) / calls, 4) if calls else 0.0,
            "coverage": round(sum(covered) / len(covered), 4) if covered else None}
