"""Nothing parsed is ignored: every field ``grounding-rl train`` / ``sft`` parse is in
:data:`grounding_rl.update.fields.FIELDS`, every refused field set to another value than its default is one stderr line
and exit 2 before any model loads, and k-bit loading is refused on a machine without CUDA and bitsandbytes."""
import dataclasses
import json
import re

import pytest
import yaml

from grounding_rl.cli import main as cli
from grounding_rl.paths import REPO_ROOT
from grounding_rl.update.fields import FIELDS, HONOURS, REFUSED, is_default, refused_settings
from grounding_rl.update.recipes import recipe_fields

CONFIGS = {"grpo": REPO_ROOT / "configs" / "demo_grpo.yaml", "sft": REPO_ROOT / "configs" / "demo_sft.yaml"}


def stage_classes(stage):
    from trl import ModelConfig

    from grounding_rl.cli.common import GroundingScriptArguments
    from grounding_rl.update.config import GroundingGRPOConfig
    from grounding_rl.update.recipes import recipe_arguments
    from grounding_rl.update.sft import GroundingSFTConfig

    if stage == "grpo":
        return GroundingScriptArguments, GroundingGRPOConfig, ModelConfig, *recipe_arguments()
    return GroundingScriptArguments, GroundingSFTConfig, ModelConfig


def stage_fields(stage):
    return {f.name: f for cls in stage_classes(stage) for f in dataclasses.fields(cls)}


@pytest.mark.parametrize("stage", ["grpo", "sft"])
def test_every_parsed_field_is_in_the_table(stage):
    fields = stage_fields(stage)
    missing = sorted(name for name in fields if getattr(FIELDS.get(name), stage, None) is None)
    assert not missing, f"fields of {stage} missing from grounding_rl/update/fields.py FIELDS: {missing}"
    assert all(getattr(FIELDS[name], stage) in HONOURS for name in fields)


def test_the_table_names_no_field_that_is_not_parsed():
    known = set(stage_fields("grpo")) | set(stage_fields("sft"))
    assert sorted(set(FIELDS) - known) == []
    sft_only = {name for name, h in FIELDS.items() if h.grpo is None}
    assert sft_only == {"think_text", "crop_trajectory_fraction", "max_tool_calling_iterations"} - set(recipe_fields())
    assert not sft_only & set(stage_fields("grpo"))


def refused_cases():
    return [(stage, name) for stage in ("grpo", "sft") for name in sorted(stage_fields(stage))
            if getattr(FIELDS[name], stage) == REFUSED]


# a non-default value the parser accepts for each refused field whose type alone does not give one
VALUES = {"vllm_mode": "server", "lora_task_type": "SEQ_CLS", "hub_strategy": "end", "hub_model_id": "me/model",
          "train_sampling_strategy": "sequential", "length_column_name": "n_tokens", "eval_strategy": "steps",
          "torch_compile_backend": "inductor", "torch_compile_mode": "max-autotune", "label_names": ["labels"],
          "include_for_metrics": ["inputs"], "liger_kernel_config": {"rms_norm": True},
          "parallelism_config": {"tp_size": 2}, "include_num_input_tokens_seen": True, "metric_for_best_model": "loss",
          "eval_accumulation_steps": 2, "eval_delay": 1.0, "eval_steps": 5.0, "per_device_eval_batch_size": 2,
          "label_smoothing_factor": 0.1, "neftune_noise_alpha": 5.0, "hub_private_repo": True,
          "greater_is_better": True}


def non_default(field: dataclasses.Field):
    if field.name in VALUES:
        return VALUES[field.name]
    if isinstance(field.default, bool):
        return not field.default
    if field.type in ("str | None", str, "str"):
        return "x"
    raise AssertionError(f"give a non-default value for {field.name} in VALUES")


def test_the_refused_fields_are_the_expected_ones():
    counts = {stage: sum(1 for s, _ in refused_cases() if s == stage) for stage in ("grpo", "sft")}
    refused = {name for _, name in refused_cases()}
    assert {"hub_always_push", "torch_compile", "include_num_input_tokens_seen", "label_smoothing_factor",
            "train_sampling_strategy", "length_column_name", "vllm_mode", "auto_find_batch_size",
            "lora_task_type"} <= refused
    assert counts["grpo"] > 25 and counts["sft"] > 25, counts


@pytest.mark.parametrize("stage,name", refused_cases())
def test_a_refused_field_set_is_one_line_and_exit_2(stage, name, tmp_path, capsys, monkeypatch):
    import transformers

    def no_loading(*args, **kwargs):
        raise AssertionError("a model began to load")

    monkeypatch.setattr(transformers.AutoModelForImageTextToText, "from_pretrained", no_loading)
    config = yaml.safe_load(CONFIGS[stage].read_text())
    value = non_default(stage_fields(stage)[name])
    config[name] = value
    config["output_dir"] = str(tmp_path / "out")
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(config))
    monkeypatch.chdir(tmp_path)  # the line names c.yaml: pytest's folder name cannot push the reason past its width
    assert cli(["train" if stage == "grpo" else "sft", "--config", "c.yaml"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    assert f"{name} " in lines[0] and "is refused" in lines[0] and "more characters" not in lines[0], lines[0]
    assert not (tmp_path / "out").exists()


def test_defaults_and_the_shipped_configs_refuse_nothing():
    from trl import ModelConfig

    assert refused_settings(ModelConfig(), "grpo") == [] and refused_settings(ModelConfig(), "sft") == []
    for path in sorted((REPO_ROOT / "configs").glob("*.yaml")):
        keys = yaml.safe_load(path.read_text()) or {}
        stage = "sft" if "sft" in path.name else "grpo"
        set_refused = [k for k in keys if k in FIELDS and getattr(FIELDS[k], stage) == REFUSED
                       and not is_default(keys[k], dataclasses.MISSING if k not in stage_fields(stage)
                                          else (lambda f: f.default if f.default is not dataclasses.MISSING
                                                else f.default_factory())(stage_fields(stage)[k]))]
        assert set_refused == [], f"{path.name} sets refused fields {set_refused}"
    assert is_default(False, "no") and is_default("", []) and is_default(None, None)
    assert not is_default(True, False) and not is_default("server", "colocate") and not is_default(0.1, 0.0)


@pytest.mark.parametrize("flag", ["--load_in_4bit", "--load_in_8bit"])
@pytest.mark.parametrize("sub", ["train", "sft"])
def test_kbit_without_cuda_or_bitsandbytes_is_one_line(sub, flag, tmp_path, capsys):
    """This machine has no CUDA and no bitsandbytes: one line before anything loads, the model folder not read."""
    from grounding_rl.models.loading import kbit_unavailable

    if kbit_unavailable() is None:
        pytest.skip("CUDA and bitsandbytes are present")
    argv = [sub, "--config", str(CONFIGS["grpo" if sub == "train" else "sft"]), flag, "true", "--use_peft", "true",
            "--model_name_or_path", str(tmp_path / "not_built_yet"), "--output_dir", str(tmp_path / "out")]
    assert cli(argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "k-bit loading needs CUDA and bitsandbytes" in lines[0], lines
    assert flag[2:] in lines[0]


def test_kbit_rules_where_it_could_load(tmp_path, capsys, monkeypatch):
    """With CUDA and bitsandbytes (pretended): only with use_peft, one of 4/8-bit, no 8-bit under ZeRO-3."""
    import transformers.integrations

    import grounding_rl.models.loading as loading

    monkeypatch.setattr(loading, "kbit_unavailable", lambda: None)
    base = ["train", "--config", str(CONFIGS["grpo"]), "--output_dir", str(tmp_path / "out"), "--model_name_or_path",
            str(tmp_path / "m")]
    cases = [(["--load_in_4bit", "true"], "load_in_4bit needs use_peft: true"),
             (["--load_in_4bit", "true", "--load_in_8bit", "true", "--use_peft", "true"], "8 bit and 4 bit"),
             (["--load_in_8bit", "true", "--use_peft", "true"], "load_in_8bit with DeepSpeed ZeRO-3 is refused")]
    for extra, text in cases:
        if "ZeRO-3" in text:
            monkeypatch.setattr(transformers.integrations, "is_deepspeed_zero3_enabled", lambda: True)
        assert cli(base + extra) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and text in lines[0], lines


def test_quantization_config_leaves_the_vision_tower_and_head_unquantized(qwen_processor_dir, qwen3_processor_dir):
    """The BitsAndBytesConfig built from ModelConfig (trl.get_quantization_config) and, on the real module names of
    both families (built on the meta device), which linear layers transformers' bnb quantizer would convert."""
    import torch
    from transformers import AutoConfig, AutoModelForImageTextToText
    from transformers.quantizers.quantizers_utils import should_convert_module
    from trl import ModelConfig

    from grounding_rl.models.loading import KBIT_SKIP_MODULES, quantization_config

    assert quantization_config(ModelConfig()) is None
    four = quantization_config(ModelConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", use_bnb_nested_quant=True,
                                           dtype="auto"))
    assert (four.load_in_4bit, four.load_in_8bit, four.bnb_4bit_quant_type, four.bnb_4bit_use_double_quant,
            four.bnb_4bit_compute_dtype) == (True, False, "nf4", True, torch.bfloat16)
    assert four.llm_int8_skip_modules == list(KBIT_SKIP_MODULES)
    eight = quantization_config(ModelConfig(load_in_8bit=True, dtype="float16"))
    assert (eight.load_in_8bit, eight.load_in_4bit, eight.llm_int8_skip_modules) == (True, False,
                                                                                    list(KBIT_SKIP_MODULES))
    with pytest.raises(ValueError, match="8 bit and 4 bit"):
        ModelConfig(load_in_4bit=True, load_in_8bit=True)
    for folder in (qwen_processor_dir, qwen3_processor_dir):
        config = AutoConfig.from_pretrained(folder)
        config.text_config.num_hidden_layers, config.vision_config.depth = 2, 2
        if hasattr(config.vision_config, "deepstack_visual_indexes"):
            config.vision_config.deepstack_visual_indexes = [0]
        with torch.device("meta"):
            model = AutoModelForImageTextToText.from_config(config)
        linears = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
        converted = {n for n in linears if should_convert_module(n, four.llm_int8_skip_modules)}
        vision = {n for n in linears if n.startswith("model.visual.")}
        assert vision and any(".merger." in n for n in vision), folder
        assert converted == set(linears) - vision - {"lm_head"}, folder
        assert any(n.startswith("model.language_model.layers.") for n in converted)


def test_merge_lora_refuses_a_quantized_base(tmp_path, capsys):
    base = tmp_path / "base"
    base.mkdir()
    (base / "config.json").write_text(json.dumps({"model_type": "qwen2_5_vl",
                                                  "quantization_config": {"load_in_4bit": True}}))
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": str(base)}))
    assert cli(["merge-lora", "--adapter", str(adapter), "--out", str(tmp_path / "merged")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "the base is a quantized checkpoint" in err[0], err


@pytest.mark.parametrize("sub", ["train", "sft", "distill"])
def test_help_lists_what_the_command_honours(sub, capsys):
    """``--help`` leaves out every refused setting (the refusal itself is tested above) and keeps the honoured ones."""
    from grounding_rl.update.distill_config import GRPO_ONLY

    with pytest.raises(SystemExit) as exit_:
        cli([sub, "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    stage = "sft" if sub == "sft" else "grpo"
    refused = {name for s, name in refused_cases() if s == stage} | (set(GRPO_ONLY) if sub == "distill" else set())
    listed = {line.split()[0].lstrip("-").split("[")[0] for line in out.splitlines() if line.startswith("  --")}
    assert refused and not refused & listed, sorted(refused & listed)
    assert {"learning_rate", "video_fps", "model_name_or_path", "train_file"} <= listed
    count = re.search(rf"(\d+) settings that {sub} refuses are not listed", out)
    assert count and int(count.group(1)) >= len(refused), count
    assert ("beta" in listed) == (sub != "sft") and ("epsilon" in listed) == (sub == "train")
