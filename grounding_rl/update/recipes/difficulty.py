"""Offline difficulty selection: Time-R1's range filter, TimeLens's difficulty-weighted subset and TimeLens2's
rollout-dispersion weights, applied once to the training set before training
(:func:`grounding_rl.data.selection.select_samples`, seeded by ``seed``: the same on
every rank). Scores come from ``grounding-rl difficulty`` (each train_file line's ``"difficulty": {"iou", ...}``)."""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

from grounding_rl.data.selection import (ROLLOUTS, TIMELENS2_MEAN_REWARD, TIMELENS2_P_MEAN, TIMELENS2_P_STD,
                                          TIMELENS_DURATION_EDGES)
from grounding_rl.errors import UserError
from grounding_rl.update.recipes.base import Recipe, range_problem

logger = logging.getLogger(__name__)

DIFFICULTY_SAMPLING = ("none", "timelens", "dispersion")


@dataclass
class DifficultyArguments:
    """The offline selection's fields (each names its source)."""

    difficulty_sampling: str = field(
        default="none",
        metadata={"help": "'timelens': train on TimeLens's difficulty-weighted subset (TencentARC/TimeLens "
                          "@5d90c06 training/data/grounding.py): samples annotated outside their video dropped, then "
                          "difficulty_subset_size samples split over its 9 duration buckets, drawn once, without "
                          "replacement, seeded by `seed`, with weight exp(-0.5((iou - 0.05)/0.2)^2) / (count of its "
                          "IoU bin of 20 + 1e-6) (TimeLens's numbers, fixed), iou being TimeLens's own parse of the "
                          "raw answer (difficulty.timelens_iou). "
                          "'dispersion': every sample, each epoch a permutation weighted by TimeLens2's "
                          "(std + 1e-8)^difficulty_p_std * (1 - mean + 1e-8)^difficulty_p_mean of its rollouts' "
                          "rewards (MCG-NJU/TimeLens2 grpo/timelens/rewards/sampling.py; difficulty.rollout_intervals "
                          "from grounding-rl difficulty --num-rollouts or TimeLens2's rollout files). "
                          "'none': every sample. Needs the train_file's difficulty scores."},
    )
    difficulty_p_std: float = field(
        default=TIMELENS2_P_STD, metadata={"help": "dispersion: exponent of the rollout rewards' std (TimeLens2's "
                                                   "sample_weight_std_power; its 8B and 4B scripts: 0)."})
    difficulty_p_mean: float = field(
        default=TIMELENS2_P_MEAN, metadata={"help": "dispersion: exponent of (1 - mean rollout reward) (TimeLens2's "
                                                    "sample_weight_mean_power; its 8B and 4B scripts: 2)."})
    difficulty_mean_reward: str = field(
        default=TIMELENS2_MEAN_REWARD,
        metadata={"help": "dispersion: the reward (a registry name) whose mean over the rollouts the weight reads "
                          "(TimeLens2's sample_weight_mean_spec tiou, our set_iou); the std reads the training "
                          "rewards (reward_funcs with reward_weights, format left out as TimeLens2 does)."})
    difficulty_subset_size: int = field(
        default=2500, metadata={"help": "Samples TimeLens's draw keeps (its script: --target_size 2500); at least "
                                        "the training set's size keeps every sample (a warning says so)."})
    difficulty_range: list[float] | None = field(
        default=None,
        metadata={"help": "Offline range filter [low, high]: train only on samples whose scored IoU is in (low, high] "
                          "(xiaomi-research/time-r1 src/utils/process_data.py keeps (0, 0.7]: [0.0, 0.7]). Applied "
                          "before difficulty_sampling. None = off."},
    )


class DifficultySelection(Recipe):
    """Keeps the samples :func:`grounding_rl.data.selection.select_samples` selects; the counts are logged and kept
    as :attr:`counts`. Active with a ``difficulty_sampling`` or a ``difficulty_range`` (without
    either the selection keeps every sample)."""

    name = "difficulty_selection"
    arguments = DifficultyArguments
    fingerprint_keys = tuple(DifficultyArguments.__dataclass_fields__)  # they select the samples a run trains on

    switch = "difficulty_sampling"
    conflict_message = "difficulty_sampling dispersion orders the epoch by weight; {} filters it: use one of them"

    @classmethod
    def conflicts_of(cls, args) -> tuple[str, ...]:
        return ("online_filter",) if args.difficulty_sampling == "dispersion" else ()

    @staticmethod
    def enabled(args, config) -> bool:
        return args.difficulty_sampling != "none" or args.difficulty_range is not None

    @staticmethod
    def problems(args, config) -> list[str]:
        problems = []
        if args.difficulty_sampling not in DIFFICULTY_SAMPLING:
            problems.append(f"difficulty_sampling {args.difficulty_sampling!r} is not one of {DIFFICULTY_SAMPLING}")
        if args.difficulty_subset_size < 1:
            problems.append(f"difficulty_subset_size must be ≥ 1 (got {args.difficulty_subset_size})")
        dispersion_set = (args.difficulty_p_std, args.difficulty_p_mean, args.difficulty_mean_reward) != (
            TIMELENS2_P_STD, TIMELENS2_P_MEAN, TIMELENS2_MEAN_REWARD)
        if dispersion_set and args.difficulty_sampling != "dispersion":
            problems.append("difficulty_p_std, difficulty_p_mean and difficulty_mean_reward weigh samples only with "
                            f"difficulty_sampling: dispersion (it is {args.difficulty_sampling!r})")
        if args.difficulty_sampling == "dispersion":
            from grounding_rl.reward.rewards import get_reward_funcs

            try:
                get_reward_funcs([args.difficulty_mean_reward])
            except ValueError as err:
                problems.append(f"difficulty_mean_reward: {err}")
        return problems + range_problem("difficulty_range", args.difficulty_range)

    def prepare_data(self, context, dataset):
        from grounding_rl.data.dataset import GroundingDataset
        from grounding_rl.data.selection import select_samples

        args = self.args
        indices, counts = select_samples(
            dataset.samples, sampling=args.difficulty_sampling, score_range=args.difficulty_range,
            subset_size=args.difficulty_subset_size, duration_edges=TIMELENS_DURATION_EDGES, seed=self.config.seed)
        self.counts = counts
        if args.difficulty_sampling == "dispersion":
            kept = dataset if len(indices) == len(dataset) else GroundingDataset([dataset.samples[i] for i in indices])
            self.weights = self.dispersion(context, kept.samples, counts)
            return kept
        if len(indices) == len(dataset):
            if args.difficulty_sampling == "timelens":
                logger.warning("difficulty_sampling timelens: difficulty_subset_size %d keeps all %d samples, so the "
                               "weighting changes nothing; lower difficulty_subset_size", args.difficulty_subset_size,
                               len(dataset))
            return dataset
        logger.info("difficulty selection: kept %(kept)d of %(samples)d samples (range filter dropped "
                    "%(range_dropped_low)d at or below its low end and %(range_dropped_high)d above its high end; "
                    "TimeLens's draw dropped %(out_of_video_dropped)d annotated outside their video, reweighted "
                    "%(reweighted)d and drew %(drawn)d)", counts)
        return GroundingDataset([dataset.samples[i] for i in indices])

    def dispersion(self, context, samples, counts):
        """TimeLens2's weight of each sample (:func:`grounding_rl.data.selection.dispersion_weights`) from its
        ``difficulty.rollout_intervals``: each interval set is scored as the JSON answer ``[[s, e], ...]`` by the
        training rewards (the row's ``reward_spec`` where it has one; ``format`` left out; an empty set scores 0,
        TimeLens2's ``score_intervals``) for the std and
        by ``difficulty_mean_reward`` for the mean. Adds ``reweighted``, ``without_rollouts`` and ``top_decile_weight``
        (the weight share of the heaviest 10 %) to ``counts`` and logs them."""
        import json

        import numpy as np
        from tqdm import tqdm

        from grounding_rl.data.selection import FIELD, dispersion_weights
        from grounding_rl.reward.rewards import get_reward_funcs

        args = self.args
        train = [(f, float(w)) for f, w, name in zip(context.reward_funcs, context.reward_weights.tolist(),
                                                     context.reward_func_names) if name != "format"]
        mean_func = get_reward_funcs([args.difficulty_mean_reward])[0]

        def score(funcs, sets, sample):
            texts = [json.dumps(ivs) for ivs in sets]
            k = len(sets)
            columns = {"start": [sample["start"]] * k, "end": [sample["end"]] * k,
                       "duration": [sample["duration"]] * k, "spans": [sample.get("spans")] * k,
                       "raw_spans": [sample.get("raw_spans")] * k,
                       "query": [sample["query"]] * k, "qid": [sample.get("qid")] * k,
                       "prompt_template": [sample.get("prompt_template") or self.config.prompt_template] * k}
            totals = np.zeros(k)
            for func, weight in funcs:
                values = func(completions=texts, **columns)
                totals += [0.0 if v is None else weight * float(v) for v in values]
            return [0.0 if not ivs else float(t) for ivs, t in zip(sets, totals)]

        rewards, means, missing = [], [], 0
        for sample in tqdm(samples, desc="dispersion weights", unit=" samples", disable=None):
            sets = (sample.get(FIELD) or {}).get(ROLLOUTS) or []
            missing += len(sets) < 2
            funcs = train
            if sample.get("reward_spec") and sets:  # the row's own spec, as TimeLens2's score_intervals reads it
                from grounding_rl.update.sources import row_weights

                try:
                    weights = row_weights(sample["reward_spec"], list(context.reward_func_names))
                except ValueError as err:
                    raise UserError(f"train_file: qid {sample.get('qid')!r}: {err}") from None
                funcs = [(f, w) for f, w, name in zip(context.reward_funcs, weights, context.reward_func_names)
                         if name != "format"]
            rewards.append(score(funcs, sets, sample) if sets else [])
            means.append(score([(mean_func, 1.0)], sets, sample) if sets else [])
        weights = dispersion_weights(rewards, means, args.difficulty_p_std, args.difficulty_p_mean)
        top = np.sort(weights)[::-1][:max(1, len(weights) // 10)].sum()
        counts.update(reweighted=len(samples), without_rollouts=missing, top_decile_weight=round(float(top), 6))
        logger.info("difficulty_sampling dispersion: reweighted %d samples (p_std %s, p_mean %s, mean on %s); %d have "
                    "fewer than 2 rollouts (TimeLens2's fallback: std 0, mean 0); the heaviest 10%% carry %.1f%% of "
                    "the weight", len(samples), args.difficulty_p_std, args.difficulty_p_mean,
                    args.difficulty_mean_reward, missing, 100 * top)
        return weights

    def sampler(self, context, dataset):
        if self.args.difficulty_sampling != "dispersion":
            return None
        from grounding_rl.data.dataset import weighted_repeat_sampler
        from grounding_rl.update.arguments import data_seed

        args, G = self.config, context.num_generations
        return weighted_repeat_sampler(dataset, self.weights, mini_repeat_count=G,
                                       batch_size=args.generation_batch_size // G,
                                       repeat_count=args.num_iterations * args.steps_per_generation,
                                       seed=data_seed(args))
