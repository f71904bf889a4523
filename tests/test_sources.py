"""A training set mixing sources: each row its own prompt template and reward spec (TimeLens2's per-source data
config), the weights where rewards are summed, and the mix in grounding_config.json."""
import json

import pytest
import torch

from grounding_rl.data.dataset import GroundingDataset, read_row_settings
from grounding_rl.errors import UserError
from grounding_rl.reward.rewards import weighted_rewards
from grounding_rl.update.sources import row_settings, row_weights

torch.set_num_threads(1)
NAMES = ["twass1", "set_iou", "parse_penalty", "iou"]


def test_row_settings_are_read_and_checked(tmp_path):
    path = tmp_path / "mix.jsonl"
    rows = [{"qid": "a", "prompt_template": "timelens2", "reward_spec": "twass1,tiou,parse_penalty"},
            {"prompt_template": "timelens_100k"}, {"qid": "c"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert read_row_settings(path) == {"a": {"prompt_template": "timelens2",
                                             "reward_spec": "twass1,tiou,parse_penalty"},
                                       "1": {"prompt_template": "timelens_100k"}}
    path.write_text(json.dumps({"qid": "a", "reward_spec": 3}) + "\n")
    with pytest.raises(UserError, match=r"mix.jsonl:1: reward_spec must be a non-empty string"):
        read_row_settings(path)


def test_a_rows_spec_weighs_the_runs_functions():
    assert row_weights("twass1,tiou,parse_penalty", NAMES) == [1.0, 1.0, 1.0, 0.0]  # TimeLens2's tiou is set_iou
    assert row_weights("tiou:2,twass1:0.5", NAMES) == [0.5, 2.0, 0.0, 0.0]
    with pytest.raises(ValueError, match=r"needs \['r2twass1'\].*add them to reward_funcs"):
        row_weights("r2twass1", NAMES)
    # per-row weights where rewards are summed: row 0 under [1, 1, 1, 0], row 1 under the run's [0, 0, 0, 1]
    rewards = torch.tensor([[0.5, 0.25, -1.0, 0.75], [0.5, 0.25, 0.0, 0.75]])
    assert weighted_rewards(rewards, torch.tensor([[1.0, 1, 1, 0], [0, 0, 0, 1]])).tolist() == [-0.25, 0.75]


def test_the_mix_is_checked_weighted_and_recorded():
    samples = [{"video": "v.mp4", "query": "q", "start": 0.0, "end": 1.0, "duration": 5.0, "qid": str(i), **extra}
               for i, extra in enumerate([{"prompt_template": "timelens2", "reward_spec": "twass1,tiou,parse_penalty"},
                                          {"prompt_template": "timelens_100k", "reward_spec": "tiou"},
                                          {"prompt_template": "timelens2", "reward_spec": "twass1,tiou,parse_penalty"},
                                          {}])]
    weights = torch.tensor([0.0, 0.0, 0.0, 1.0])
    per_row, mix = row_settings(samples, NAMES, weights, "default")
    assert per_row.tolist() == [[1, 1, 1, 0], [0, 1, 0, 0], [1, 1, 1, 0], [0, 0, 0, 1]]
    assert mix == [
        {"prompt_template": "timelens2", "reward_spec": "twass1,tiou,parse_penalty", "rows": 2},
        {"prompt_template": "default", "reward_spec": None, "rows": 1},
        {"prompt_template": "timelens_100k", "reward_spec": "tiou", "rows": 1}]
    assert [GroundingDataset(samples)[i]["prompt_template"] for i in range(4)] == ["timelens2", "timelens_100k",
                                                                                   "timelens2", None]
    assert row_settings(samples[3:], NAMES, weights, "default") == (None, None)  # one source: nothing per row
    with pytest.raises(UserError, match="qid '0' has prompt_template 'timelens3'"):
        row_settings([{**samples[0], "prompt_template": "timelens3"}], NAMES, weights, "default")
    with pytest.raises(UserError, match=r"qid '0': reward_spec 'ngiou' needs \['ngiou'\]"):
        row_settings([{**samples[0], "reward_spec": "ngiou"}], NAMES, weights, "default")


def test_each_row_is_prompted_and_rewarded_by_its_source(tiny_model_dir, videos_dir, tmp_path):
    """One GRPO step on two clips, one a TimeLens2-93K row (its JSON-array prompt, rewarded by set_iou only), one
    without settings (the run's template and weights): the reward functions see each row's template, the prompts
    hold each row's text, and grounding_config.json records the mix."""
    from conftest import MAKEUP, POOL, grpo_config, make_grpo_trainer

    from grounding_rl.data.video import sample_frames
    from grounding_rl.update.batching import prompt_batch

    seen = []

    def set_iou(completions, prompt_template, **columns):
        seen.extend(prompt_template)
        return [0.5] * len(completions)
    set_iou.__name__ = "set_iou"

    def iou(completions, **columns):
        return [1.0] * len(completions)

    rows = [{"video": str(videos_dir / POOL), "query": "the pool is cleaned", "start": 1.0, "end": 4.0,
             "duration": 10.0, "qid": "a", "prompt_template": "timelens2", "reward_spec": "set_iou"},
            {"video": str(videos_dir / MAKEUP), "query": "eye makeup", "start": 1.0, "end": 4.0, "duration": 6.5,
             "qid": "b"}]
    path = tmp_path / "mix.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    dataset = GroundingDataset.from_jsonl(path)
    config = grpo_config(tmp_path / "out", num_generations=2, reward_weights=[0.0, 1.0], save_strategy="steps",
                         save_steps=1, logging_steps=1)
    trainer = make_grpo_trainer(tiny_model_dir, config, dataset, reward_funcs=(set_iou, iou))
    assert trainer.row_reward_weights.tolist() == [[1.0, 0.0], [0.0, 1.0]]
    trainer.train()
    assert sorted(set(seen)) == ["default", "timelens2"] and len(seen) == 4
    logged = next(h for h in trainer.state.log_history if "reward" in h)
    assert logged["reward"] == pytest.approx((0.5 + 1.0) / 2)  # row a: 1·0.5 + 0·1; row b: 0·0.5 + 1·1
    saved = json.loads((tmp_path / "out" / "checkpoint-1" / "grounding_config.json").read_text())
    assert saved["data_mix"] == [{"prompt_template": "default", "reward_spec": None, "rows": 1},
                                 {"prompt_template": "timelens2", "reward_spec": "set_iou", "rows": 1}]
    items = [{**dataset[i], "clip": sample_frames(dataset[i]["video"], trainer.data_collator.settings)}
             for i in range(2)]
    texts = trainer.processing_class.batch_decode(prompt_batch(trainer.processing_class, items, "default")
                                                  ["prompt_ids"])
    assert "Task: temporal retrieval." in texts[0] and "Task: temporal retrieval." not in texts[1]
    assert 'When does the event "eye makeup" happen' in texts[1]
