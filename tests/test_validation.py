"""Validation during GRPO training: ``eval_strategy: steps`` runs the greedy evaluation of ``grounding-rl eval`` on
``eval_file``, logs its metrics, ``load_best_model_at_end`` restores the best checkpoint, and training itself is the
same with or without it."""
import json

import pytest
import torch
from safetensors.torch import load_file

from conftest import MAKEUP, POOL, varied_reward
from test_resume import dataset as train_set, grpo_args

from grounding_rl.data.samples import Sample
from grounding_rl.models.loading import load_policy, load_processor
from grounding_rl.rollout import greedy
from grounding_rl.update.config import GroundingGRPOConfig
from grounding_rl.update.trainer import GroundingGRPOTrainer

torch.set_num_threads(1)


def args_for(out, **overrides):
    """test_resume's GRPO settings, 2 steps with a checkpoint after each."""
    return grpo_args(out, **{"max_steps": 2, "save_steps": 1, **overrides})


def eval_set(videos_dir):
    # the pool clip: 1-4 s of 10 s; the make-up clip: 2-6 s of 6.5 s
    return [Sample(str(videos_dir / POOL), "a", 1.0, 4.0, 10.0, "e1", "t"),
            Sample(str(videos_dir / MAKEUP), "b", 2.0, 6.0, 6.5, "e2", "t")]


def weights(trainer):
    return {k: v.detach().clone() for k, v in trainer.accelerator.unwrap_model(trainer.model).state_dict().items()}


def test_eval_steps_log_metrics_and_the_best_checkpoint_is_loaded(tmp_path, tiny_model_dir, videos_dir, monkeypatch):
    """The greedy answers are fixed per evaluation (the model's own are unparseable): at step 1 both are exact
    (mIoU 100), at step 2 ``1 to 4`` for both (IoU 1 on the pool clip, 2/5 on the make-up clip: mIoU 70, R1@0.5 50).
    The best is checkpoint-1, whose weights the trainer ends with; checkpoint-2 equals the weights of the same run
    without validation (the evaluation leaves every random state as it was)."""
    calls, answers = [], {1: ["1.0 to 4.0", "2.0 to 6.0"], 2: ["1.0 to 4.0", "1.0 to 4.0"]}

    def fixed_answers(model, processor, queries, videos, template, params, video_layout):
        calls.append((template, params.do_sample, params.max_new_tokens, params.synced_gpus, len(queries)))
        step = trainer.state.global_step
        return [f"<think>t</think><answer>{answers[step][0 if q == 'a' else 1]}</answer>" for q in queries]

    monkeypatch.setattr(greedy, "generate_answers", fixed_answers)
    trainer = GroundingGRPOTrainer(
        load_policy(str(tiny_model_dir)),
        args_for(tmp_path / "val", eval_strategy="steps", eval_steps=1, eval_file="eval.jsonl",
                 load_best_model_at_end=True, per_device_eval_batch_size=8),
        train_set(videos_dir), load_processor(str(tiny_model_dir)), reward_funcs=[varied_reward],
        eval_dataset=eval_set(videos_dir))
    trainer.train()
    assert calls == [("default", False, 8, False, 2)] * 2  # greedy, max_completion_length, ranks alone, one batch
    evals = {h["step"]: h for h in trainer.state.log_history if "eval_mIoU" in h}
    assert evals[1]["eval_mIoU"] == pytest.approx(100.0) and evals[1]["eval_R1@0.7"] == 100.0
    assert evals[2]["eval_mIoU"] == pytest.approx(70.0) and evals[2]["eval_R1@0.5"] == 50.0
    assert evals[2]["eval_R1@0.3"] == 100.0 and evals[2]["eval_clamped_mIoU"] == pytest.approx(70.0)
    assert evals[2]["eval_n"] == 2.0 and evals[2]["eval_format_rate"] == 100.0
    assert trainer.state.best_model_checkpoint.endswith("checkpoint-1") and trainer.state.best_metric == 100.0
    final = weights(trainer)
    best = load_file(str(tmp_path / "val" / "checkpoint-1" / "model.safetensors"))
    last = load_file(str(tmp_path / "val" / "checkpoint-2" / "model.safetensors"))
    moved = [k for k in best if not torch.equal(best[k], last[k])]
    assert moved  # step 2 changed the weights, so loading the best shows
    unwrapped = trainer.accelerator.unwrap_model(trainer.model)
    from grounding_rl.update.resume import load_full_weights

    reference = load_policy(str(tiny_model_dir))
    load_full_weights(reference, tmp_path / "val" / "checkpoint-1")
    assert all(torch.equal(final[k], v) for k, v in reference.state_dict().items())
    assert unwrapped.training  # back in training mode after each evaluation

    plain = GroundingGRPOTrainer(load_policy(str(tiny_model_dir)), args_for(tmp_path / "plain", save_strategy="no"),
                                 train_set(videos_dir), load_processor(str(tiny_model_dir)),
                                 reward_funcs=[varied_reward])
    plain.train()
    reference = load_policy(str(tiny_model_dir))
    load_full_weights(reference, tmp_path / "val" / "checkpoint-2")
    assert all(torch.equal(weights(plain)[k], v) for k, v in reference.state_dict().items())


def test_train_command_reads_eval_file_from_the_yaml_keys(tmp_path, tiny_model_dir, videos_dir):
    from grounding_rl.cli.common import parse_training_args
    from grounding_rl.paths import REPO_ROOT
    from grounding_rl.update.recipes import each

    script, args, _ = parse_training_args(GroundingGRPOConfig, [
        "--config", str(REPO_ROOT / "configs" / "tiny_real_clips.yaml"), "--model_name_or_path", str(tiny_model_dir),
        "--output_dir", str(tmp_path), "--eval_strategy", "steps", "--eval_steps", "2",
        "--eval_file", str(videos_dir / "annotations.jsonl"), "--eval_max_samples", "3",
        "--online_difficulty_range", "0.0", "0.7"], "grounding-rl train")
    own = args.recipe_args
    assert own["online_filter"].online_difficulty_range == [0.0, 0.7] and own["validation"].eval_max_samples == 3
    inputs = next(out for out in each(args, "trainer_inputs", args, script) if out)
    samples, dropped = inputs["eval_dataset"], inputs["eval_dropped"]
    lines = [json.loads(line) for line in (videos_dir / "annotations.jsonl").read_text().splitlines()[:3]]
    assert [s.query for s in samples] == [line["query"] for line in lines] and dropped == 0
    assert all(s.video.startswith(str(videos_dir)) for s in samples)
