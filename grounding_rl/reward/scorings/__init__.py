"""Scorings that reproduce the published evaluators, by name: each a pure function from the model's answer texts and
the annotations to that evaluator's R1@0.3/0.5/0.7, mIoU and n.

Each reproduces its evaluator exactly — its parser and choice of pair, its rule for reversed pairs and failures, its
denominator and duplicate collapse, its float comparisons (misses of exact ties included) and its rule for a missing
prediction — and names the repository, commit and file it follows (:attr:`Scoring.source`, written to
``metrics.json``). They sit beside our own ``standard`` and ``clamped`` (:mod:`grounding_rl.reward.metrics`), and
``grounding-rl score|eval|compare --scoring NAME|all`` shows them side by side. Checked against the evaluators' own
functions on ``tests/fixtures/published_scorings.json`` (``tests/test_scorings.py``).

Input: one record per query, a mapping with ``answer`` (the model's text, None when there is none: the clip failed to
load), ``video``, ``query``, ``qid``, ``duration`` and the annotation as written — ``raw_start``/``raw_end`` when
present, else ``start``/``end`` (seconds). A record given only ``pred_start``/``pred_end`` numbers has no text: these
evaluators read text, so it is a missing prediction under each one's rule.

Output: ``{"n", "R1@0.3", "R1@0.5", "R1@0.7", "mIoU", "parse_failure_rate"}`` in percent (an evaluator that reports
fractions is multiplied by 100), ``n`` the evaluator's own denominator, plus a few evaluator-specific counts.
``parse_failure_rate``: percent of ``n`` whose text gave no pair under the evaluator's parser.

The registry (:mod:`.registry`) is a plain dict: :func:`register` adds a :class:`Scoring`, :func:`get_scoring` reads
one; importing this package registers the seven published evaluators' scorings and the two of interval sets
(``set``, ``qvhighlights``: :mod:`.sets`).
"""
from grounding_rl.reward.scorings.registry import REGISTRY, Scoring, get_scoring, register
# importing registers, in this order (the order of tables)
from grounding_rl.reward.scorings import timelens  # noqa: F401,I001
from grounding_rl.reward.scorings import lmms_eval  # noqa: F401
from grounding_rl.reward.scorings import timelens2  # noqa: F401
from grounding_rl.reward.scorings import timezero  # noqa: F401
from grounding_rl.reward.scorings import time_r1  # noqa: F401
from grounding_rl.reward.scorings import sets  # noqa: F401

__all__ = ["REGISTRY", "Scoring", "get_scoring", "register"]
