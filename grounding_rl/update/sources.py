"""Per-source prompts and rewards (a step of every run, not a recipe: :func:`row_settings`): a training set that mixes sources, each row carrying its own ``prompt_template``
and, where given, ``reward_spec`` (:func:`grounding_rl.data.dataset.read_row_settings`), as TimeLens2 trains
TimeLens2-93K and TimeLens-100K with two prompts and a reward spec per source (MCG-NJU/TimeLens2 @a5ce450,
``grpo/timelens/data/sources.py``, ``grpo/configs/data/timelens2.json``).

A row's template is used for its prompt (:func:`grounding_rl.update.batching.prompt_batch`) and its reward columns;
a row's reward spec becomes that row's weights over the run's ``reward_funcs`` (0 for a function not in its spec;
rows without one keep ``reward_weights``), applied where the rewards are summed
(:func:`grounding_rl.update.rollout.build_rollout`). The mix — rows per (template, reward spec) — is logged and
saved in ``grounding_config.json`` (``data_mix``)."""
from __future__ import annotations

import logging
from collections import Counter

from grounding_rl.errors import UserError

logger = logging.getLogger(__name__)


def row_weights(spec: str, names: list[str]) -> list[float]:
    """The weights over the run's reward functions ``names`` of one row's reward spec (TimeLens2's
    ``"name[:weight],…"`` or our names, :func:`grounding_rl.reward.set_rewards.translate_timelens2_spec`).

    Raises:
        ValueError: a malformed spec, or a function of the spec that the run does not compute (names it).
    """
    from grounding_rl.reward.set_rewards import translate_timelens2_spec

    funcs, weights = translate_timelens2_spec(spec)
    missing = [f for f in funcs if f not in names]
    if missing:
        raise ValueError(f"reward_spec {spec!r} needs {missing}, which reward_funcs {names} does not compute: add "
                         "them to reward_funcs (weight 0 where only some rows use them)")
    out = [0.0] * len(names)
    for func, weight in zip(funcs, weights):
        out[names.index(func)] += float(weight)
    return out


def row_settings(samples: list[dict], reward_func_names: list[str], reward_weights, prompt_template: str):
    """``(row_reward_weights, data_mix)`` of the training ``samples`` (after any selection), each row's template and
    spec checked: (num_samples, F) float32 weights over ``reward_func_names`` (:func:`row_weights`; ``reward_weights``
    (F,) for a row without a spec), None when no row has a spec; and the rows per ``{"prompt_template",
    "reward_spec", "rows"}`` (logged), None when no row has its own settings.

    Raises:
        UserError: a row's unknown template, or a spec needing a function the run does not compute (names the qid).
    """
    import torch

    from grounding_rl.prompts.templates import TEMPLATES

    names, default = list(reward_func_names), [float(w) for w in reward_weights.tolist()]
    table, mix, any_spec = [], Counter(), False
    for sample in samples:
        template, spec = sample.get("prompt_template"), sample.get("reward_spec")
        if template is not None and template not in TEMPLATES:
            raise UserError(f"train_file: qid {sample.get('qid')!r} has prompt_template {template!r}; known: "
                            f"{sorted(TEMPLATES)}")
        if spec is not None:
            any_spec = True
            try:
                table.append(row_weights(spec, names))
            except ValueError as err:
                raise UserError(f"train_file: qid {sample.get('qid')!r}: {err}") from None
        else:
            table.append(default)
        mix[(template or prompt_template, spec)] += 1
    own = any(s.get("prompt_template") is not None or s.get("reward_spec") is not None for s in samples)
    data_mix = [{"prompt_template": t, "reward_spec": s, "rows": n} for (t, s), n in sorted(
        mix.items(), key=lambda kv: (-kv[1], kv[0][0], kv[0][1] or ""))] if own else None
    if own:
        logger.info("training set mixes %d sources: %s", len(mix), "; ".join(
            f"{m['rows']} rows with {m['prompt_template']}" + (f" rewarded {m['reward_spec']}" if m["reward_spec"]
                                                               else "") for m in data_mix))
    return torch.tensor(table, dtype=torch.float32) if any_spec else None, data_mix
