"""The model-side helpers that generation and both loss forwards share: unwrapping a trained model, finding its core
model, and encoding each distinct clip once.

A batch that shares videos keeps the patches of its U *distinct* clips and a ``video_index`` (B,) telling which clip each
of its B rows uses (any mapping: a clip may have G rows, fewer when a group is split across ranks, or a different count
than its neighbours). :func:`encode_videos` runs the vision tower once on the U clips and hands each row its clip's
features through transformers' ``mm_encoder_outputs`` (the ``forward`` and ``generate`` of both families accept it;
what a row's share holds — Qwen3-VL's DeepStack features too — is the family's
:meth:`~grounding_rl.family.Family.select_features`); the gradients of all rows of a clip flow into its one encoding.
"""
from __future__ import annotations

import torch

from grounding_rl.family import family_of


def unwrap(model):
    """The module inside DDP / DeepSpeed engine wrappers (accelerate's ``extract_model_from_parallel``); a PEFT model
    is kept as it is (its attribute access reaches the base model, and disabling its adapter still applies)."""
    from accelerate.utils import extract_model_from_parallel

    return extract_model_from_parallel(model, keep_fp32_wrapper=True, keep_torch_compile=True)


def core_model(model):
    """The core model (``Qwen2_5_VLModel``, ``Qwen3VLModel``: holder of ``rope_deltas`` and ``get_rope_index``) inside
    a possibly wrapped model.

    Raises:
        AttributeError: no core model with ``get_rope_index`` is found.
    """
    model = unwrap(model)
    for attr in ("base_model", "model"):
        while hasattr(model, attr) and not hasattr(model, "get_rope_index"):
            model = getattr(model, attr)
    if not hasattr(model, "get_rope_index"):
        raise AttributeError(f"{type(model).__name__} has no Qwen-VL core model with get_rope_index")
    return model


def first_rows(video_index: torch.Tensor) -> list[int]:
    """For each distinct clip u = 0..U-1, the first row that uses it.

    Args:
        video_index: (B,) clip index of each row; every clip 0..U-1 must be used by at least one row.

    Raises:
        ValueError: some clip in 0..max is used by no row (its patches would be orphaned).
    """
    index = video_index.tolist() if isinstance(video_index, torch.Tensor) else list(video_index)
    num_clips = max(index) + 1 if index else 0
    first = {}
    for row, clip in enumerate(index):
        first.setdefault(clip, row)
    missing = [u for u in range(num_clips) if u not in first]
    if missing:
        raise ValueError(f"video_index {index} leaves distinct clips {missing} without a row")
    return [first[u] for u in range(num_clips)]


def encode_videos(model, pixel_values_videos: torch.Tensor, video_grid_thw: torch.Tensor, rows) -> dict:
    """Encode each distinct clip once and give every row its clip's features.

    Args:
        model: a Qwen-VL model, possibly DDP/DeepSpeed/PEFT-wrapped (its ``get_video_features`` is called; with a
            PEFT model whose adapter is disabled, the adapter-free encoder runs).
        pixel_values_videos: patches of the U distinct clips, concatenated (Σ_u t_u·h_u·w_u, 3·2·patch²).
        video_grid_thw: (U, 3) grid of each distinct clip.
        rows: (B,) tensor or list: for each model row, the index (0..U-1) of its clip; repeats and any order allowed.

    Returns:
        ``mm_encoder_outputs`` for the model call: ``{"video": output}`` whose ``pooler_output`` is a tuple of B
        tensors (tokens_u, hidden) (and, for Qwen3-VL, ``deepstack_features`` one such tuple per DeepStack layer);
        pass it instead of ``pixel_values_videos`` and keep ``video_grid_thw``, ``mm_token_type_ids`` (and
        Qwen2.5-VL's ``second_per_grid_ts``) per row: they give the 3D position ids.
    """
    inner = unwrap(model)
    return rows_features(inner, inner.get_video_features(pixel_values_videos, video_grid_thw, return_dict=True), rows)


def rows_features(model, features, rows) -> dict:
    """``mm_encoder_outputs`` giving each of the rows ``rows`` (clip indices, repeats and any order allowed) its
    clip's share of ``features`` (``get_video_features(..., return_dict=True)`` on the distinct clips, computed once):
    what :func:`encode_videos` returns, for any subset of rows without encoding again."""
    rows = rows.tolist() if isinstance(rows, torch.Tensor) else list(rows)
    return {"video": family_of(unwrap(model)).select_features(features, rows)}


class VideoFeatureCache:
    """The vision tower's output for videos by key, kept across calls: a multi-turn rollout encodes each distinct clip
    or window at the first turn that shows it, and every later turn (and every row of a group) reuses its features.

    Exact: the features of a video do not depend on the others encoded with it (the tower attends within each frame
    group, ``cu_seqlens``), so a later turn gets the tensors it would compute again, up to fp summation order
    (``tests/test_multiturn.py``). Valid while the model's weights do not change (one rollout).

    Args:
        model: the (unwrapped) generation model; its ``get_video_features`` is called under ``torch.no_grad``.
    """

    def __init__(self, model):
        self.model = model
        self.index: dict = {}  # key -> position in pooled
        self.pooled: list[torch.Tensor] = []
        self.deepstack: list[list[torch.Tensor]] | None = None  # per DeepStack layer (Qwen3-VL), per video
        self.encoded = 0  # videos that went through the tower

    @torch.no_grad()
    def encoder_outputs(self, videos: list[dict]) -> dict:
        """``mm_encoder_outputs`` for ``videos`` in token order (each ``{"pixel_values_videos", "video_grid_thw",
        "key"}``, :class:`grounding_rl.rollout.conversation.Trajectory` ``videos``), encoding in one call only those
        whose key is not yet cached."""
        inner = unwrap(self.model)
        new = {}
        for video in videos:
            if video["key"] not in self.index and video["key"] not in new:
                new[video["key"]] = video
        if new:
            device = inner.device
            out = inner.get_video_features(torch.cat([v["pixel_values_videos"] for v in new.values()]).to(device),
                                           torch.stack([torch.as_tensor(v["video_grid_thw"]) for v in new.values()]
                                                       ).to(device), return_dict=True)
            layers = getattr(out, "deepstack_features", None)
            if layers is not None and self.deepstack is None:
                self.deepstack = [[] for _ in layers]
            for i, key in enumerate(new):
                self.index[key] = len(self.pooled)
                self.pooled.append(out.pooler_output[i])
                for layer, features in zip(self.deepstack or [], layers or []):
                    layer.append(features[i])
            self.encoded += len(new)
        from types import SimpleNamespace

        features = SimpleNamespace(pooler_output=tuple(self.pooled),
                                   deepstack_features=[tuple(layer) for layer in self.deepstack or []])
        return rows_features(inner, features, [self.index[v["key"]] for v in videos])


def rope_position_ids(model, inputs: dict) -> torch.Tensor:
    """The 3-D RoPE position ids (3, B, L) the model computes for full rows, as its own forward would without
    ``position_ids``: ``get_rope_index`` on ``input_ids``, ``mm_token_type_ids``, ``attention_mask`` and the family's
    per-row video tensors (:attr:`grounding_rl.family.Family.row_video_keys`: ``video_grid_thw`` and, for
    Qwen2.5-VL, ``second_per_grid_ts``)."""
    positions, _ = core_model(model).get_rope_index(
        inputs["input_ids"],
        mm_token_type_ids=inputs["mm_token_type_ids"],
        attention_mask=inputs["attention_mask"],
        **{k: inputs[k] for k in family_of(unwrap(model)).row_video_keys},
    )
    return positions


PLACEHOLDER_KEYS = ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id")


def placeholder_token_ids(model) -> list[int]:
    """The vision placeholder token ids of a Qwen-VL model's config (``image_token_id``, ``video_token_id``,
    ``vision_start_token_id``, ``vision_end_token_id``; both families keep them at the top level). A completion that
    contains one cannot go through the model's forward: transformers counts every such id in ``input_ids`` as a slot
    for vision features ("Video features and video tokens do not match")."""
    config = unwrap(model).config
    return sorted({int(getattr(config, key)) for key in PLACEHOLDER_KEYS if getattr(config, key, None) is not None})
