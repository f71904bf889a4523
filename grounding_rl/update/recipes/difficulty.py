"""Offline difficulty selection: Time-R1's range filter and TimeLens's difficulty-weighted subset, applied once to the
training set before training (:func:`grounding_rl.data.selection.select_samples`, seeded by ``seed``: the same on
every rank). Scores come from ``grounding-rl difficulty`` (each train_file line's ``"difficulty": {"iou", ...}``)."""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

from grounding_rl.data.selection import TIMELENS_DURATION_EDGES
from grounding_rl.update.recipes.base import Recipe

logger = logging.getLogger(__name__)

DIFFICULTY_SAMPLING = ("none", "timelens")


@dataclass
class DifficultyArguments:
    """The offline selection's fields (each names its source)."""

    difficulty_sampling: str = field(
        default="none",
        metadata={"help": "'timelens': train on TimeLens's difficulty-weighted subset (TencentARC/TimeLens "
                          "@5d90c06 training/data/grounding.py): samples annotated outside their video dropped, then "
                          "difficulty_subset_size samples split over the duration buckets, drawn once, without "
                          "replacement, seeded by `seed`, with weight exp(-0.5((iou - mean)/std)^2) / (count of its "
                          "IoU bin + 1e-6), iou being TimeLens's own parse of the raw answer (difficulty.timelens_iou). "
                          "'none': every sample. Needs the train_file's difficulty scores."},
    )
    difficulty_gaussian_mean: float = field(
        default=0.05, metadata={"help": "Centre of TimeLens's IoU Gaussian (its train_scripts/run_grpo_qwen3_8b.sh: "
                                        "--gaussian_filter_mean 0.05, favouring hard samples)."})
    difficulty_gaussian_std: float = field(
        default=0.2, metadata={"help": "Width of TimeLens's IoU Gaussian (its script: --gaussian_filter_std 0.2)."})
    difficulty_num_bins: int = field(
        default=20, metadata={"help": "Inverse-density IoU bins on [0, 1] (TimeLens's fixed_gaussian_sampling: 20, "
                                      "set by its script); 0 = the Gaussian weight alone."})
    difficulty_subset_size: int = field(
        default=2500, metadata={"help": "Samples TimeLens's draw keeps (its script: --target_size 2500); at least "
                                        "the training set's size keeps every sample (a warning says so)."})
    difficulty_duration_edges: list[float] | None = field(
        default_factory=lambda: list(TIMELENS_DURATION_EDGES),
        metadata={"help": "Duration strata of the draw in seconds, the subset split evenly over [0, e1], [e1, e2], "
                          "..., [ek, inf) (default TimeLens's 9 buckets, training/data/hybrid.py: 30 60 90 120 150 "
                          "180 210 240). null or [] = one stratum."},
    )
    difficulty_range: list[float] | None = field(
        default=None,
        metadata={"help": "Offline range filter [low, high]: train only on samples whose scored IoU is in (low, high] "
                          "(xiaomi-research/time-r1 src/utils/process_data.py keeps (0, 0.7]: [0.0, 0.7]). Applied "
                          "before difficulty_sampling. None = off."},
    )


def range_problem(key: str, value) -> list[str]:
    """The message for a ``[low, high]`` range field that is not ``0 ≤ low < high ≤ 1`` (empty when fine)."""
    if value is not None and (len(value) != 2 or not 0.0 <= value[0] < value[1] <= 1.0):
        return [f"{key} must be [low, high] with 0 ≤ low < high ≤ 1 (got {value})"]
    return []


class DifficultySelection(Recipe):
    """Keeps the samples :func:`grounding_rl.data.selection.select_samples` selects; the counts are logged and kept
    as the trainer's ``data_selection``. Always active (with the defaults it keeps every sample)."""

    name = "difficulty_selection"
    arguments = DifficultyArguments

    @staticmethod
    def enabled(args) -> bool:
        return True

    @staticmethod
    def problems(args) -> list[str]:
        problems = []
        if args.difficulty_sampling not in DIFFICULTY_SAMPLING:
            problems.append(f"difficulty_sampling {args.difficulty_sampling!r} is not one of {DIFFICULTY_SAMPLING}")
        if args.difficulty_gaussian_std <= 0 or args.difficulty_num_bins < 0 or args.difficulty_subset_size < 1:
            problems.append(f"difficulty_gaussian_std > 0, difficulty_num_bins ≥ 0 and difficulty_subset_size ≥ 1 "
                            f"required (got {args.difficulty_gaussian_std}, {args.difficulty_num_bins}, "
                            f"{args.difficulty_subset_size})")
        edges = args.difficulty_duration_edges
        if edges and (any(e <= 0 for e in edges) or list(edges) != sorted(set(edges))):
            problems.append(f"difficulty_duration_edges must be increasing seconds > 0 (got {edges})")
        return problems + range_problem("difficulty_range", args.difficulty_range)

    def prepare_data(self, trainer, dataset):
        from grounding_rl.data.dataset import GroundingDataset
        from grounding_rl.data.selection import select_samples

        args = self.args
        indices, counts = select_samples(
            dataset.samples, sampling=args.difficulty_sampling, score_range=args.difficulty_range,
            mean=args.difficulty_gaussian_mean, std=args.difficulty_gaussian_std, num_bins=args.difficulty_num_bins,
            subset_size=args.difficulty_subset_size, duration_edges=args.difficulty_duration_edges, seed=args.seed)
        trainer.data_selection = counts
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
