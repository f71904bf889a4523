"""The Hub push (``push_to_hub``, ``hub_strategy``; :mod:`grounding_rl.update.hub`) and the model card
(:func:`grounding_rl.update.saving.model_card`, :func:`grounding_rl.update.saving.add_evaluation`).

The push is checked at the ``huggingface_hub`` call: ``HfApi.create_repo`` and ``HfApi.create_commit`` are replaced by
a recorder (the installed client uploads through hf-xet, which no local stand-in speaks), which notes each commit's
files in order and, at that moment, whether each pushed checkpoint is complete. The tests run offline, so the offline
refusal is bypassed by setting the constant it reads, ``huggingface_hub.constants.HF_HUB_OFFLINE``.
"""
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from huggingface_hub import HfApi, ModelCard, RepoUrl, constants

from grounding_rl.errors import UserError
from grounding_rl.paths import REPO_ROOT
from grounding_rl.update import checkpoints, hub

torch.set_num_threads(1)

RUN_FILES = ["grounding_config.json", "run_fingerprint.json", "README.md"]


@pytest.fixture
def recorder(monkeypatch):
    """``{"repos": [repo ids created], "commits": [(message, [path_in_repo, ...], {checkpoint folder: complete})]}``"""
    seen = {"repos": [], "commits": []}

    def create_repo(self, repo_id, token=None, private=None, exist_ok=False, **kwargs):
        seen["repos"].append((repo_id, private))
        return RepoUrl(f"https://huggingface.co/{repo_id}")

    def create_commit(self, repo_id, operations, commit_message, token=None, revision=None, **kwargs):
        assert repo_id == "me/run"
        sources = {Path(op.path_or_fileobj).parent for op in operations}
        complete = {s.name: checkpoints.checkpoint_problem(s) is None for s in sources
                    if checkpoints.checkpoint_step(s) is not None}
        seen["commits"].append((commit_message, [op.path_in_repo for op in operations], complete))

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(HfApi, "create_repo", create_repo)
    monkeypatch.setattr(HfApi, "create_commit", create_commit)
    return seen


def assert_run_files_first(paths):
    assert paths[:3] == RUN_FILES, paths[:5]


def test_grpo_pushes_after_the_run_files_and_only_complete_checkpoints(tmp_path, demo_dir, bpe_tiny_model_dir,
                                                                         recorder):
    from grounding_rl.cli import main

    out = tmp_path / "run"
    assert main(["train", "--config", str(REPO_ROOT / "configs" / "demo_grpo.yaml"), "--model_name_or_path",
                 str(bpe_tiny_model_dir), "--train_file", str(demo_dir / "train.jsonl"), "--output_dir", str(out),
                 "--max_train_samples", "2", "--per_device_train_batch_size", "4", "--num_generations", "2",
                 "--max_completion_length", "8", "--max_steps", "2", "--save_strategy", "steps", "--save_steps", "1",
                 "--logging_steps", "1", "--disable_tqdm", "true", "--push_to_hub", "true", "--hub_model_id",
                 "me/run", "--hub_strategy", "checkpoint", "--hub_private_repo", "true"]) == 0
    assert recorder["repos"] == [("me/run", True)]
    messages = [c[0] for c in recorder["commits"]]
    assert messages == ["Training in progress, step 1", "Training in progress, step 2", "End of training"]
    for step, (_, paths, complete) in zip((1, 2), recorder["commits"]):
        assert complete == {f"checkpoint-{step}": True}  # pushed after its mark, whole
        assert_run_files_first(paths)
        top = [p for p in paths if "/" not in p]
        assert "model.safetensors" in top and not {"optimizer.pt", "trainer_state.json", checkpoints.MARK} & set(top)
        inside = [p for p in paths if p.startswith("last-checkpoint/")]
        assert inside[-1] == f"last-checkpoint/{checkpoints.MARK}" and "last-checkpoint/optimizer.pt" in inside
        assert len(top) + len(inside) == len(paths)
    _, final, complete = recorder["commits"][-1]
    assert_run_files_first(final)
    assert complete == {} and not [p for p in final if p.startswith("checkpoint-")]
    assert {"model.safetensors", "trainer_state.json", "train_results.json"} <= set(final)
    # the card: metadata and the settings evaluation reuses
    card = ModelCard.load(out / "README.md")
    assert card.data.base_model == str(bpe_tiny_model_dir)
    assert {"grounding-rl", "video-temporal-grounding", "grpo"} <= set(card.data.tags)
    assert "| prompt template | `default` |" in card.text and "| video layout |" in card.text
    assert "| video fps | `2.0` |" in card.text
    # eval on the run's folder puts its table into the card (what a later push carries)
    assert main(["eval", "--model", str(out), "--data", str(demo_dir / "test.jsonl"), "--limit", "2", "--out",
                 str(tmp_path / "ev")]) == 0
    card = ModelCard.load(out / "README.md")
    section = card.text.split("\n## Evaluation\n\n### test.jsonl\n\n| n | R1@0.3 |", 1)[1]
    assert section.splitlines()[2].startswith("| 2 | ") and f"report: `{tmp_path / 'ev' / 'report.md'}`" in section
    assert card.data.base_model == str(bpe_tiny_model_dir)  # the metadata kept


@pytest.mark.parametrize("strategy", ["all_checkpoints", "every_save", "end"])
def test_sft_pushes_each_complete_checkpoint_as_the_strategy_asks(tmp_path, demo_dir, bpe_tiny_model_dir, recorder,
                                                                  strategy):
    from grounding_rl.cli import main

    out = tmp_path / "run"
    assert main(["sft", "--config", str(REPO_ROOT / "configs" / "demo_sft.yaml"), "--model_name_or_path",
                 str(bpe_tiny_model_dir), "--train_file", str(demo_dir / "train.jsonl"), "--output_dir", str(out),
                 "--max_train_samples", "2", "--per_device_train_batch_size", "2", "--max_steps", "2",
                 "--save_strategy", "steps", "--save_steps", "1", "--disable_tqdm", "true", "--report_to", "none",
                 "--push_to_hub", "true", "--hub_model_id", "me/run", "--hub_strategy", strategy]) == 0
    expected = [] if strategy == "end" else [{"checkpoint-1": True}, {"checkpoint-2": True}]
    assert [c[2] for c in recorder["commits"]] == expected + [{}]
    for step, (_, paths, _) in zip((1, 2), recorder["commits"][:-1]):
        assert_run_files_first(paths)
        if strategy == "all_checkpoints":
            assert paths[-1] == f"checkpoint-{step}/{checkpoints.MARK}"
        else:  # the checkpoint's model and run files at the top, no training state
            assert "model.safetensors" in paths and not [p for p in paths if "/" in p or p == "optimizer.pt"]
    assert_run_files_first(recorder["commits"][-1][1])
    assert "sft" in ModelCard.load(out / "README.md").data.tags


def test_a_failed_push_is_one_line(tmp_path, demo_dir, bpe_tiny_model_dir, recorder, monkeypatch, capsys):
    """The repository cannot be created (a token, a name): one line before training, nothing written; the final
    upload fails: one line saying the run is complete on disk."""
    from grounding_rl.cli import main

    def refuse(self, repo_id, **kwargs):  # the text of huggingface_hub's HfHubHTTPError for a bad token
        raise RuntimeError("401 Client Error: Unauthorized for url: https://huggingface.co/api/repos/create")

    monkeypatch.setattr(HfApi, "create_repo", refuse)
    out = tmp_path / "run"
    assert main(["sft", "--config", str(REPO_ROOT / "configs" / "demo_sft.yaml"), "--model_name_or_path",
                 str(bpe_tiny_model_dir), "--train_file", str(demo_dir / "train.jsonl"), "--output_dir", str(out),
                 "--max_train_samples", "2", "--push_to_hub", "true", "--hub_model_id", "me/run"]) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()
             and not line.startswith("Loading weights")]
    assert lines == ["grounding-rl sft: error: push_to_hub: creating the Hub repository me/run failed (401 Client "
                     "Error: Unauthorized for url: https://huggingface.co/api/repos/create); log in with hf auth login "
                     "(or set hub_token) and check hub_model_id"]
    assert not out.exists()

    def fail(self, **kwargs):
        raise OSError("Connection reset")

    monkeypatch.setattr(HfApi, "create_commit", fail)
    (tmp_path / "done").mkdir()
    (tmp_path / "done" / "model.safetensors").write_bytes(b"x")
    trainer = SimpleNamespace(args=SimpleNamespace(push_to_hub=True, output_dir=str(tmp_path / "done"),
                                                   hub_token=None, hub_revision=None),
                              hub_model_id="me/run", is_world_process_zero=lambda: True)
    with pytest.raises(UserError, match=r"pushing .*done to me/run failed \(Connection reset\); the run is complete "
                                        r"there: upload it with hf upload me/run .*done$"):
        hub.push_run(trainer)


def test_the_token_is_never_pushed(tmp_path, recorder):
    from grounding_rl.update.saving import training_command

    assert training_command(["grounding-rl", "train", "--hub_token", "hf_a", "--hub_token=hf_b", "--seed", "1"]) == \
        "grounding-rl train --hub_token '***' '--hub_token=***' --seed 1"
    (tmp_path / "training_args.bin").write_bytes(b"pickled args with the token")
    (tmp_path / "model.safetensors").write_bytes(b"x")
    args = SimpleNamespace(push_to_hub=True, output_dir=str(tmp_path), hub_token="hf_a", hub_revision=None)
    hub.push_run(SimpleNamespace(args=args, hub_model_id="me/run", is_world_process_zero=lambda: True))
    assert recorder["commits"][-1][1] == ["model.safetensors"]


def test_hub_settings_problems(monkeypatch):
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    args = SimpleNamespace(push_to_hub=True, hub_model_id="me/run", hub_strategy="end", hub_revision=None,
                           hub_token="hf_secret")
    (line,) = hub.settings_problems(args)
    assert "HF_HUB_OFFLINE is set" in line
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    assert hub.settings_problems(args) == []
    args.push_to_hub = False
    lines = hub.settings_problems(args)
    assert [line.split(" ", 1)[0] for line in lines] == ["hub_model_id", "hub_strategy", "hub_token"]
    assert not [line for line in lines if "hf_secret" in line]


def _card(tmp_path, **extra):
    from grounding_rl.prompts.preprocessing import GroundingConfig
    from grounding_rl.update.saving import write_grounding_files

    write_grounding_files(tmp_path, GroundingConfig(), "Qwen/Qwen2.5-VL-7B-Instruct", "distillation", "grounding-rl x",
                          **extra)
    return ModelCard.load(tmp_path / "README.md")


def test_the_card_names_data_sets_trackers_and_stage(tmp_path):
    from grounding_rl.update.saving import datasets_of, tracker_lines

    dataset = SimpleNamespace(samples=[{"source": "charades_sta"}, {"source": "time_r1"}, {"source": "jsonl"},
                                       {"source": "charades_sta"}, {"source": "manual"}])
    assert datasets_of(dataset) == ["charades_sta", "time_r1"]
    assert datasets_of(SimpleNamespace(samples=[{"source": "jsonl"}])) is None
    args = SimpleNamespace(report_to=["trackio", "tensorboard"], run_name="r1", project="vtg",
                           trackio_space_id="me/dash")
    trackers = tracker_lines(args)
    assert trackers[0] == ("Trackio project `vtg`, run `r1` on the Space [me/dash](https://huggingface.co/spaces/"
                           "me/dash)")
    assert trackers[1].startswith("TensorBoard event files under `runs/`")
    assert tracker_lines(SimpleNamespace(report_to=[], run_name=None)) == []
    card = _card(tmp_path, datasets=datasets_of(dataset), trackers=trackers)
    assert card.data.datasets == ["charades_sta", "time_r1"]
    assert card.data.base_model == "Qwen/Qwen2.5-VL-7B-Instruct"
    assert card.data.tags == ["grounding-rl", "video-temporal-grounding", "distillation"]
    assert "## Training run\n\n- Trackio project `vtg`" in card.text
    assert "| training data | `charades_sta, time_r1` |" in card.text


def test_eval_adds_and_replaces_its_section_in_the_card(tmp_path):
    from grounding_rl.update.saving import add_evaluation

    _card(tmp_path)
    metrics = {"n": 4, "R1@0.3": 50.0, "R1@0.5": 25.0, "R1@0.7": 0.0, "mIoU": 31.25, "parse_failure_rate": 0.0,
               "format_rate": 100.0, "data": "/d/test.jsonl", "benchmark": None, "seed": 0, "created": "T"}
    assert add_evaluation(tmp_path, metrics, "ev/report.md") == tmp_path / "README.md"
    assert add_evaluation(tmp_path, {**metrics, "mIoU": 40.0}, "ev2/report.md") is not None  # the same data: replaced
    assert add_evaluation(tmp_path, {**metrics, "benchmark": "charades_sta_test", "mIoU": 12.5},
                          "ev3/report.md") is not None
    card = ModelCard.load(tmp_path / "README.md")
    section = card.text.split("\n## Evaluation\n", 1)[1]
    assert [line for line in section.splitlines() if line.startswith("### ")] == ["### test.jsonl",
                                                                                  "### charades_sta_test"]
    assert "| 4 | 50.00 | 25.00 | 0.00 | 40.00 | 0.00 | 100.00 |" in section and "31.25" not in section
    assert "report: `ev2/report.md`" in section and "seed" not in section
    assert card.data.tags == ["grounding-rl", "video-temporal-grounding", "distillation"]  # metadata kept
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "grounding_config.json").write_text(json.dumps({}))
    (foreign / "README.md").write_text("---\nlicense: mit\n---\n# someone's card\n")
    assert add_evaluation(foreign, metrics, "r.md") is None
    (tmp_path / checkpoints.MARK).write_text("{}")  # a complete checkpoint: its mark lists the card's size
    before = (tmp_path / "README.md").read_text()
    assert add_evaluation(tmp_path, metrics, "r.md") is None and (tmp_path / "README.md").read_text() == before
    assert (foreign / "README.md").read_text() == "---\nlicense: mit\n---\n# someone's card\n"
