"""Difficulty-aware training data: which samples GRPO trains on, given each sample's IoU under a model.

The scores come from ``grounding-rl difficulty`` (the greedy evaluation of a starting model; each JSONL line gets
``"difficulty": {"iou", "reward", "pred"}``) or, online, from the training rewards themselves. Two recipes:

* **TimeLens** (TencentARC/TimeLens @5d90c06 ``training/data/grounding.py``, ``GroundingDataset._filter_annos``):
  first drop every annotation that reaches outside its video (its ``GroundingDataset.__init__`` keeps a sample only
  when a span lies in [0, duration]; we clamp such spans elsewhere), then weight each
  sample by a Gaussian of its IoU, ``w = exp(-0.5 ((iou - mean) / std)^2)``, optionally times the inverse density of
  its IoU bin, ``1 / (count of its bin + 1e-6)`` over ``num_bins`` equal bins on [0, 1]; then draw a subset *without
  replacement* with probabilities ``w / sum(w)`` (``np.random.default_rng(seed).choice``), per duration stratum.
  Its script (``train_scripts/run_grpo_qwen3_8b.sh``) sets mean 0.05, std 0.2, ``fixed_gaussian_sampling`` (the 20
  inverse-density bins) and ``target_size`` 2500; ``training/data/hybrid.py`` splits the target evenly over the
  9 duration ranges [0, 30], [30, 60], …, [210, 240], [240, ∞) seconds. The IoU is the one its filter script gives
  the raw answer (its parser, the raw span, no clamping): ``difficulty.timelens_iou``
  (:func:`grounding_rl.reward.scorings.timelens.timelens_filter_iou`, written by ``grounding-rl difficulty``).
* **TimeLens2** (MCG-NJU/TimeLens2 @a5ce450 ``grpo/timelens/rewards/sampling.py``, ``build_sample_weights``): each
  sample's K rollouts (interval sets, ``difficulty.rollout_intervals``) are scored; the sample's weight is
  ``(std + 1e-8)^p_std · (1 − mean + 1e-8)^p_mean`` of those rewards (:func:`dispersion_weights`) and the epoch's
  order a weighted permutation (:func:`grounding_rl.data.dataset.weighted_repeat_sampler`). Its 8B and 4B scripts
  set p_std 0, p_mean 2, the mean on ``tiou``.
* **Time-R1** (xiaomi-research/time-r1 ``src/utils/process_data.py``, task ``0070_all``; run per epoch by
  ``scripts/posttrain/train_rl_SF.sh``): keep the samples whose IoU lies in (0, 0.7].

Everything here is a pure function of the scores and a seed (never of the rank), so every process selects the same
samples. :class:`OnlineRangeFilter` is the per-epoch state of Time-R1's filter applied to the IoU rewards of training.
"""
from __future__ import annotations

import math
import os
from collections.abc import Sequence

import numpy as np

from grounding_rl.errors import UserError
from grounding_rl.jsonl_files import JsonLines

FIELD = "difficulty"  # the JSONL field grounding-rl difficulty writes: {"iou", "reward", "pred", "answer", ...}
TIMELENS_KEY = "timelens_iou"  # the score TimeLens's draw reads (its filter script's IoU)
TIMELENS_MEAN, TIMELENS_STD, TIMELENS_NUM_BINS, TIMELENS_SUBSET_SIZE = 0.05, 0.2, 20, 2500
TIMELENS_DURATION_EDGES = (30.0, 60.0, 90.0, 120.0, 150.0, 180.0, 210.0, 240.0)
TIME_R1_RANGE = (0.0, 0.7)
DENSITY_EPS = 1e-6  # TimeLens: 1.0 / (counts + 1e-6)
# TimeLens2 (MCG-NJU/TimeLens2 @a5ce450) grpo/scripts/train_grpo_8b.sh (and _4b.sh): SAMPLE_WEIGHT_STD_POWER 0,
# SAMPLE_WEIGHT_MEAN_POWER 2, SAMPLE_WEIGHT_MEAN_SPEC tiou (our set_iou); eps of grpo/timelens/rewards/sampling.py
TIMELENS2_P_STD, TIMELENS2_P_MEAN, TIMELENS2_MEAN_REWARD, DISPERSION_EPS = 0.0, 2.0, "set_iou", 1e-8
ROLLOUTS = "rollout_intervals"  # the difficulty field holding each sample's K sampled interval sets


def timelens_weights(ious: Sequence[float], mean: float = TIMELENS_MEAN, std: float = TIMELENS_STD,
                     num_bins: int = TIMELENS_NUM_BINS) -> np.ndarray:
    """TimeLens's sampling probabilities of a pool of samples from their IoUs.

    ``w_i = exp(-0.5 ((iou_i - mean) / std)^2)``; with ``num_bins > 0`` also ``w_i /= count(bin_i) + 1e-6``, the bins
    being ``np.histogram(ious, bins=num_bins, range=(0, 1))``'s (an IoU of 1.0 falls in the last bin); then
    ``w / sum(w)``.

    Args:
        ious: (N,) IoUs in [0, 1].
        mean, std: the Gaussian's centre and width (IoU units).
        num_bins: inverse-density bins; 0 = the Gaussian alone (TimeLens without ``fixed_gaussian_sampling``).

    Returns:
        (N,) float64 probabilities summing to 1.

    Raises:
        ValueError: no IoUs, ``std`` ≤ 0, or every weight underflows to 0 (a far too narrow Gaussian).
    """
    values = np.asarray(ious, dtype=np.float64)
    if values.size == 0 or std <= 0:
        raise ValueError(f"timelens_weights needs IoUs and std > 0 (got {values.size} IoUs, std {std})")
    weights = np.exp(-0.5 * ((values - mean) / std) ** 2)
    if num_bins:
        counts, edges = np.histogram(values, bins=num_bins, range=(0, 1))
        bins = np.clip(np.digitize(values, bins=edges), 1, num_bins) - 1
        weights = weights / (counts + DENSITY_EPS)[bins]
    total = weights.sum()
    if not total > 0:
        raise ValueError(f"every TimeLens weight is 0 (std {std} around mean {mean}): widen the Gaussian")
    return weights / total


def duration_strata(durations: Sequence[float], edges: Sequence[float] | None) -> list[list[int]]:
    """Indices per duration range, TimeLens's buckets: with edges ``e_1 < … < e_k`` the ranges are ``[0, e_1]``,
    ``[e_1, e_2]``, …, ``[e_k, ∞)`` (seconds, both ends inclusive, the first matching range wins, as in
    ``_filter_annos``). None or empty edges: one stratum of everything. Empty strata are kept (they draw nothing)."""
    if not edges:
        return [list(range(len(durations)))]
    bounds = [0.0, *[float(e) for e in edges], math.inf]
    strata: list[list[int]] = [[] for _ in range(len(bounds) - 1)]
    for index, duration in enumerate(durations):
        for k in range(len(strata)):
            if bounds[k] <= duration <= bounds[k + 1]:
                strata[k].append(index)
                break
    return strata


def timelens_subset(ious: Sequence[float], durations: Sequence[float], size: int, *, mean: float = TIMELENS_MEAN,
                    std: float = TIMELENS_STD, num_bins: int = TIMELENS_NUM_BINS,
                    duration_edges: Sequence[float] | None = None, seed: int = 0) -> list[int]:
    """TimeLens's difficulty-weighted subset draw: the indices (ascending) of the samples to train on.

    The target is split evenly over the duration strata (:func:`duration_strata`; ``int(size / strata)`` each, as
    ``hybrid.py``); each stratum draws ``min(its share, its size)`` samples without replacement with the
    :func:`timelens_weights` of its own IoUs, from one ``np.random.default_rng(seed)`` used stratum after stratum.
    A stratum that has fewer samples than its share keeps them all, so the subset may be smaller than ``size``.

    Args:
        ious, durations: (N,) IoU in [0, 1] and clip duration in seconds of each sample.
        size: how many samples to draw in all.
        mean, std, num_bins: see :func:`timelens_weights`.
        duration_edges: stratum edges in seconds (TimeLens: :data:`TIMELENS_DURATION_EDGES`); None = one stratum.
        seed: the draw's seed (the training seed: the same subset on every rank).

    Raises:
        ValueError: ``size`` < 0, lengths differ, or a stratum has fewer non-zero weights than its share.
    """
    if size < 0 or len(ious) != len(durations):
        raise ValueError(f"timelens_subset: size {size} must be ≥ 0 and {len(ious)} IoUs match {len(durations)} "
                         "durations")
    strata = duration_strata(durations, duration_edges)
    share = int(size / len(strata))
    rng = np.random.default_rng(seed)
    chosen: list[int] = []
    for indices in strata:
        if not indices:
            continue
        take = min(share, len(indices))
        weights = timelens_weights([ious[i] for i in indices], mean, std, num_bins)
        chosen += [int(i) for i in rng.choice(indices, size=take, replace=False, p=weights)]
    return sorted(chosen)


def dispersion_weights(rewards: Sequence[Sequence[float]], mean_rewards: Sequence[Sequence[float]] | None = None,
                       p_std: float = TIMELENS2_P_STD, p_mean: float = TIMELENS2_P_MEAN,
                       eps: float = DISPERSION_EPS) -> np.ndarray:
    """TimeLens2's sampling weights from each sample's rollout rewards (MCG-NJU/TimeLens2 @a5ce450,
    ``grpo/timelens/rewards/sampling.py``, ``build_sample_weights``).

    ``w_i = (std_i + eps)^p_std`` times, when ``p_mean`` ≠ 0, ``(1 − mean_i + eps)^p_mean``; ``std_i`` the
    population standard deviation (ddof 0) of sample i's rewards, ``mean_i`` the mean of its ``mean_rewards`` (default its
    ``rewards``) clipped into [0, 1]; a sample with fewer than 2 rollouts has std 0 and mean 0 (TimeLens2's fallback:
    with p_mean > 0 it weighs as much as the hardest sample). Computed in float64, cast to float32 and normalised, as
    TimeLens2 does.

    Args:
        rewards: (N, K_i) reward of each rollout of each sample (the training reward).
        mean_rewards: (N, K_i) the rewards the mean reads (TimeLens2's ``sample_weight_mean_spec``), or None.
        p_std, p_mean: the exponents (TimeLens2's ``sample_weight_std_power`` / ``_mean_power``).
        eps: keeps a weight > 0.

    Returns:
        (N,) float64 probabilities summing to 1.

    Raises:
        ValueError: no samples, or ``mean_rewards`` of another shape.
    """
    if not len(rewards):
        raise ValueError("dispersion_weights needs at least one sample")
    means_of = rewards if mean_rewards is None else mean_rewards
    if len(means_of) != len(rewards) or any(len(a) != len(b) for a, b in zip(rewards, means_of)):
        raise ValueError("dispersion_weights: mean_rewards must have the shape of rewards")
    stds = np.array([np.std(np.asarray(r, dtype=np.float64)) if len(r) >= 2 else 0.0 for r in rewards])
    means = np.array([np.mean(np.asarray(r, dtype=np.float64)) if len(r) >= 2 else 0.0 for r in means_of])
    base = np.power(np.maximum(stds, 0.0) + eps, float(p_std))
    if p_mean != 0.0:
        base = base * np.power(1.0 - np.clip(means, 0.0, 1.0) + eps, float(p_mean))
    weights = base.astype(np.float32)
    weights = weights / weights.sum()
    return weights.astype(np.float64) / float(weights.astype(np.float64).sum())


def in_range(value: float, low: float, high: float) -> bool:
    """Time-R1's range test ``low < value ≤ high`` (its ``0 < p <= 0.7``): a sample the model already solves (IoU
    above ``high``) or cannot touch at all (IoU ``low`` = 0) is dropped."""
    return low < value <= high


def range_filter(ious: Sequence[float], low: float = TIME_R1_RANGE[0], high: float = TIME_R1_RANGE[1]) -> list[int]:
    """Indices (ascending) of the samples whose IoU passes :func:`in_range`."""
    return [i for i, iou in enumerate(ious) if in_range(float(iou), low, high)]


def read_scores(path: str | os.PathLike) -> dict[str, dict]:
    """``{qid: difficulty}`` of every line of a canonical JSONL that carries a ``difficulty`` object (with an ``iou``,
    or with ``rollout_intervals``: K interval sets of sampled answers, as TimeLens2's rollout files give them).

    The qid is the line's ``qid``, else its 0-based line number, as :func:`grounding_rl.data.samples.iter_samples`
    numbers lines. Lines without the field are left out.

    Raises:
        UserError: a ``difficulty`` that is not an object with a finite number ``iou`` in [0, 1] (file and line), or
            two lines with the same qid and different scores; JsonlError: a line that is not a JSON object.
    """
    scores: dict[str, dict] = {}
    for number, row in JsonLines(path):
        if FIELD not in row:
            continue
        score, where = row[FIELD], f"{path}:{number}"
        iou = score.get("iou") if isinstance(score, dict) else None
        rollouts = score.get(ROLLOUTS) if isinstance(score, dict) else None
        if rollouts is not None and iou is None:
            if not isinstance(rollouts, list) or not all(_is_interval_set(r) for r in rollouts):
                raise UserError(f"{where}: {FIELD}.{ROLLOUTS} must be a list of interval sets [[start, end], ...], "
                                f"got {str(rollouts)[:80]}")
        elif isinstance(iou, bool) or not isinstance(iou, (int, float)) or not 0.0 <= iou <= 1.0:
            raise UserError(f"{where}: {FIELD} must be an object with an 'iou' in [0, 1] (written by "
                            f"grounding-rl difficulty) or with {ROLLOUTS}, got {str(score)[:80]}")
        qid = str(row["qid"]) if row.get("qid") is not None else str(number - 1)
        if qid in scores and scores[qid] != score:
            raise UserError(f"{where}: qid {qid!r} is scored twice with different {FIELD}")
        scores[qid] = score
    return scores


def _is_interval_set(value) -> bool:
    return isinstance(value, list) and all(
        isinstance(p, list) and len(p) == 2 and all(isinstance(t, (int, float)) and not isinstance(t, bool) for t in p)
        for p in value)


def _is_unit(value) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and 0.0 <= value <= 1.0


def inside_video(sample: dict) -> bool:
    """Whether the annotation as written lies in [0, duration] (TimeLens keeps a sample when one of its spans
    ``0 ≤ s ≤ e ≤ duration``): ``raw_start``/``raw_end`` when the sample has them, else ``start``/``end``; a
    sample with ``spans`` (already clamped by validation) is inside when its first span is."""
    if sample.get("spans"):
        start, end = sample["spans"][0]
    else:
        start = sample.get("raw_start") if sample.get("raw_start") is not None else sample["start"]
        end = sample.get("raw_end") if sample.get("raw_end") is not None else sample["end"]
    return 0.0 <= float(start) <= float(end) <= float(sample["duration"])


def select_samples(samples: Sequence[dict], *, sampling: str = "none", score_range: Sequence[float] | None = None,
                   mean: float = TIMELENS_MEAN, std: float = TIMELENS_STD, num_bins: int = TIMELENS_NUM_BINS,
                   subset_size: int = TIMELENS_SUBSET_SIZE, duration_edges: Sequence[float] | None = None,
                   seed: int = 0) -> tuple[list[int], dict]:
    """The offline selection of a training set from its difficulty scores: Time-R1's range filter
    (:func:`range_filter`, when ``score_range``), then TimeLens's draw (:func:`timelens_subset`, when ``sampling`` is
    ``"timelens"``) among what the range kept.

    Why TimeLens's subset draw and not a weighted sampler over the whole set: the draw is what TimeLens trains on; it
    keeps each sample at most once per epoch, so a generation batch never holds the same clip twice and the epoch,
    checkpoint and exact-resume logic of the ordinary sampler stays as it is; and being one seeded function of the
    scores, it is the same on every rank. A weighted sampler with replacement would need its own resumable state and
    would repeat the hardest clips within an epoch.

    Args:
        samples: training items with ``difficulty`` (``{"iou", ...}``, :func:`read_scores`) and ``duration`` (s).
        sampling: ``"none"``, ``"timelens"`` or ``"dispersion"`` (keeps every sample: its weights order the epoch,
            :func:`dispersion_weights`).
        score_range: ``(low, high)`` of the range filter, or None.
        mean, std, num_bins, subset_size, duration_edges, seed: TimeLens's draw (:func:`timelens_subset`).

    TimeLens's draw reads each sample's ``difficulty.timelens_iou`` and first drops the samples whose annotation
    reaches outside the video (:func:`inside_video`); the range filter reads ``difficulty.iou``.

    Returns:
        (kept indices ascending, counts ``{"samples", "kept", "range_dropped_low", "range_dropped_high",
        "out_of_video_dropped", "reweighted", "drawn"}``): ``reweighted`` is the pool the draw weighted (0 without
        it).

    Raises:
        UserError: a selection is asked for and samples have no score (how many; run ``grounding-rl difficulty``),
            TimeLens's draw and a score without ``timelens_iou``, or nothing is left to train on.
    """
    counts = {"samples": len(samples), "kept": len(samples), "range_dropped_low": 0, "range_dropped_high": 0,
              "out_of_video_dropped": 0, "reweighted": 0, "drawn": 0}
    indices = list(range(len(samples)))
    if sampling in ("none", "dispersion") and score_range is None:  # dispersion weighs in the sampler, keeps all
        return indices, counts
    unscored = [s.get("qid") for s in samples if not isinstance(s.get(FIELD), dict)]
    if unscored:
        raise UserError(f"train_file: {len(unscored)} of {len(samples)} samples have no {FIELD} score (e.g. qid "
                        f"{unscored[0]!r}), which difficulty_sampling / difficulty_range need: score the file with "
                        "grounding-rl difficulty --model START_MODEL --data TRAIN.jsonl --out TRAIN_scored.jsonl")
    if score_range is not None:
        if any(s[FIELD].get("iou") is None for s in samples):
            raise UserError("train_file: difficulty_range needs each sample's difficulty.iou; some have only "
                            f"{ROLLOUTS}")
        ious = [float(s[FIELD]["iou"]) for s in samples]
        low, high = float(score_range[0]), float(score_range[1])
        indices = range_filter(ious, low, high)
        counts["range_dropped_low"] = sum(iou <= low for iou in ious)
        counts["range_dropped_high"] = sum(iou > high for iou in ious)
    if sampling == "timelens" and indices:
        missing = [samples[i].get("qid") for i in indices if not _is_unit(samples[i][FIELD].get(TIMELENS_KEY))]
        if missing:
            raise UserError(f"train_file: {len(missing)} samples have no {FIELD}.{TIMELENS_KEY} (e.g. qid "
                            f"{missing[0]!r}), the IoU TimeLens's draw reads: rescore the file with this version's "
                            "grounding-rl difficulty")
        inside = [i for i in indices if inside_video(samples[i])]
        counts["out_of_video_dropped"] = len(indices) - len(inside)
        indices = inside
        counts["reweighted"] = len(indices)
        tl_ious = [float(s[FIELD][TIMELENS_KEY]) for s in samples]
        drawn = timelens_subset([tl_ious[i] for i in indices], [float(samples[i]["duration"]) for i in indices],
                                subset_size, mean=mean, std=std, num_bins=num_bins, duration_edges=duration_edges,
                                seed=seed)
        indices = [indices[k] for k in drawn]
        counts["drawn"] = len(indices)
    counts["kept"] = len(indices)
    if not indices:
        raise UserError(f"train_file: the difficulty selection keeps none of the {len(samples)} samples ({counts}); "
                        "widen difficulty_range")
    return indices, counts


class OnlineRangeFilter:
    """Time-R1's per-epoch range filter on the training rewards: after each epoch, keep the samples whose mean IoU
    reward over their completions of that epoch lies in (low, high] (:func:`in_range`).

    Time-R1 (``scripts/posttrain/train_rl_SF.sh``) re-evaluates the trained model greedily after each epoch and
    filters with :func:`range_filter`; here the G sampled completions the epoch scored anyway stand in for that
    evaluation. A sample the epoch did not score (the sampler drops the last incomplete generation batch) is kept.
    When nothing would be kept, the previous set stays (and is counted as ``kept``).

    State (all of it in :meth:`state_dict`, so a checkpoint resumes exactly): ``active`` (sorted indices the current
    ``epoch`` trains on), this epoch's per-sample ``sums`` and ``counts`` of rewards, and ``history`` (one count
    dict per completed transition). Observations are global (gathered over ranks), so every rank holds the same state.

    Args:
        num_samples: the training set's size (indices 0 … N-1).
        low, high: the kept range (low, high].
    """

    def __init__(self, num_samples: int, low: float = TIME_R1_RANGE[0], high: float = TIME_R1_RANGE[1]):
        self.num_samples, self.low, self.high = int(num_samples), float(low), float(high)
        self.active = list(range(self.num_samples))
        self.epoch = 0
        self.sums = [0.0] * self.num_samples
        self.counts = [0] * self.num_samples
        self.history: list[dict] = []

    def observe(self, indices: Sequence[int], rewards: Sequence[float]) -> None:
        """Add one reward per completion (``indices[k]``'s completion earned ``rewards[k]``); NaN is skipped."""
        for index, reward in zip(indices, rewards):
            reward = float(reward)
            if not math.isnan(reward):
                self.sums[int(index)] += reward
                self.counts[int(index)] += 1

    def advance_to(self, epoch: int) -> dict | None:
        """Apply the filter once per epoch completed since :attr:`epoch` and return the last transition's counts
        ``{"epoch", "kept", "dropped", "dropped_low", "dropped_high", "unscored"}`` (None when ``epoch`` is not
        later). Idempotent for the same ``epoch``."""
        counts = None
        while self.epoch < epoch:
            kept, low, high, unscored = [], 0, 0, 0
            for index in self.active:
                if not self.counts[index]:
                    unscored += 1
                    kept.append(index)
                    continue
                mean = self.sums[index] / self.counts[index]
                if in_range(mean, self.low, self.high):
                    kept.append(index)
                elif mean <= self.low:
                    low += 1
                else:
                    high += 1
            if len(kept) == unscored:  # nothing scored in range: keep training on the previous set
                kept, low, high = list(self.active), 0, 0
            counts = {"epoch": self.epoch + 1, "kept": len(kept), "dropped": low + high, "dropped_low": low,
                      "dropped_high": high, "unscored": unscored}
            self.history.append(counts)
            self.active = kept
            self.epoch += 1
            self.sums = [0.0] * self.num_samples
            self.counts = [0] * self.num_samples
        return counts

    def state_dict(self) -> dict:
        return {"num_samples": self.num_samples, "low": self.low, "high": self.high, "active": list(self.active),
                "epoch": self.epoch, "sums": list(self.sums), "counts": list(self.counts),
                "history": list(self.history)}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict` in place.

        Raises:
            ValueError: the state was made for another training set size or range.
        """
        if (state["num_samples"], state["low"], state["high"]) != (self.num_samples, self.low, self.high):
            raise ValueError(f"the online filter state is for {state['num_samples']} samples in ({state['low']}, "
                             f"{state['high']}], this run has {self.num_samples} in ({self.low}, {self.high}]")
        self.active, self.epoch = [int(i) for i in state["active"]], int(state["epoch"])
        self.sums, self.counts = [float(x) for x in state["sums"]], [int(x) for x in state["counts"]]
        self.history = [dict(h) for h in state["history"]]
