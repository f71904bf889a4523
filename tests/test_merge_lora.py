"""``grounding-rl merge-lora --base``: a base of another family or architecture than the adapter was trained on is
one line and exit 2 before anything is written; the base it was trained on merges."""
import json
import shutil

import pytest
import torch

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def adapter(tmp_path_factory, bpe_tiny_model_dir):
    """A LoRA adapter on the tiny Qwen2.5-VL (BPE tokenizer, as the demo's), saved with its processor as a run is."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForImageTextToText, AutoProcessor

    folder = tmp_path_factory.mktemp("adapter")
    model = AutoModelForImageTextToText.from_pretrained(bpe_tiny_model_dir)
    get_peft_model(model, LoraConfig(r=2, lora_alpha=4, target_modules=r".*language_model.*\.(q_proj|v_proj)")) \
        .save_pretrained(folder)
    AutoProcessor.from_pretrained(bpe_tiny_model_dir).save_pretrained(folder)
    return folder


def refused(cli, capsys, argv):
    capsys.readouterr()
    assert cli(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


def test_merge_lora_refuses_a_base_of_another_family(tmp_path, adapter, bpe_tiny_model_dir, tiny_qwen3_model_dir,
                                                     capsys):
    from grounding_rl.cli import main as cli

    out = tmp_path / "merged"
    err = refused(cli, capsys, ["merge-lora", "--adapter", str(adapter), "--out", str(out), "--base",
                                str(tiny_qwen3_model_dir)])
    assert f"--base {tiny_qwen3_model_dir} is a qwen3_vl Qwen3VLForConditionalGeneration model" in err
    assert f"was trained on {bpe_tiny_model_dir} (qwen2_5_vl Qwen2_5_VLForConditionalGeneration)" in err
    assert not out.exists()

    moved = tmp_path / "moved"  # the recorded base is gone: the processor saved with the adapter names the family
    shutil.copytree(adapter, moved)
    config = json.loads((moved / "adapter_config.json").read_text())
    (moved / "adapter_config.json").write_text(json.dumps({**config, "base_model_name_or_path": str(tmp_path / "gone")}))
    err = refused(cli, capsys, ["merge-lora", "--adapter", str(moved), "--out", str(out), "--base",
                                str(tiny_qwen3_model_dir)])
    assert "was saved with a Qwen2_5_VLProcessor (another model family)" in err and not out.exists()

    narrow = tmp_path / "narrow"  # the same family, another width
    shutil.copytree(bpe_tiny_model_dir, narrow)
    config = json.loads((narrow / "config.json").read_text())
    config["text_config"]["hidden_size"] = 32
    (narrow / "config.json").write_text(json.dumps(config))
    err = refused(cli, capsys, ["merge-lora", "--adapter", str(moved), "--out", str(out), "--base", str(narrow)])
    assert f"--base {narrow} has hidden_size 32, but the adapter {moved} was trained on a model of hidden_size 64" \
        in err and not out.exists()

    assert cli(["merge-lora", "--adapter", str(adapter), "--out", str(out), "--base", str(bpe_tiny_model_dir)]) == 0
    assert json.loads((out / "config.json").read_text())["model_type"] == "qwen2_5_vl"
