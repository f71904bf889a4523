"""A user's mistake is one line on stderr naming the file (and line), exit status 2, no traceback — for every CLI.

Each row of ``CASES`` is (subcommand arguments, text the line must contain), run through the ``grounding-rl``
dispatcher in-process; ``--debug`` / ``GROUNDING_RL_DEBUG=1`` shows the traceback instead.
"""
import json
from pathlib import Path

import pytest

from grounding_rl.cli import main as cli
from grounding_rl.errors import UserError
from grounding_rl.paths import REPO_ROOT, shared_dir


def broken_checkpoints(d: Path, model: Path) -> None:
    """Copies of the tiny model in ``d``: ``ckpt_missing_shard`` (its weights split into two shards with an index,
    the second shard deleted), ``ckpt_truncated`` (model.safetensors cut short) and ``ckpt_shapes`` (config.json
    asks for a wider MLP than the weights hold)."""
    import shutil

    from safetensors.torch import load_file, save_file

    for name in ("ckpt_missing_shard", "ckpt_truncated", "ckpt_shapes"):
        shutil.copytree(model, d / name)
    sharded = d / "ckpt_missing_shard"
    weights = load_file(sharded / "model.safetensors")
    (sharded / "model.safetensors").unlink()
    keys = sorted(weights)
    halves = {"model-00001-of-00002.safetensors": keys[: len(keys) // 2],
              "model-00002-of-00002.safetensors": keys[len(keys) // 2:]}
    for shard, names in halves.items():
        save_file({k: weights[k] for k in names}, sharded / shard, metadata={"format": "pt"})
    (sharded / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {k: shard for shard, names in halves.items() for k in names}}))
    (sharded / "model-00002-of-00002.safetensors").unlink()
    truncated = d / "ckpt_truncated" / "model.safetensors"
    truncated.write_bytes(truncated.read_bytes()[:-1000])
    config = json.loads((d / "ckpt_shapes" / "config.json").read_text())
    config["text_config"]["intermediate_size"] *= 2
    (d / "ckpt_shapes" / "config.json").write_text(json.dumps(config))


@pytest.fixture(scope="module")
def files(tmp_path_factory, tiny_model_dir):
    d = tmp_path_factory.mktemp("bad")
    (d / "tiny").symlink_to(tiny_model_dir)
    broken_checkpoints(d, tiny_model_dir)
    (d / "dup.yaml").write_text("train_file: t.jsonl\nmodel_name_or_path: m\nlearning_rate: 1.0e-5\nseed: 1\n"
                                "learning_rate: 2.0e-5\n")
    (d / "dup_bench.yaml").write_text((REPO_ROOT / "evaluation" / "charades_sta_test.yaml").read_text()
                                      + "\nformat: charades_sta\n")
    (d / "dup_qids.jsonl").write_text("".join(json.dumps({"video": "v.mp4", "query": "q", "start": 1, "end": 2,
                                                          "duration": 5, "qid": q}) + "\n" for q in "aba"))
    (d / "typo.yaml").write_text("train_file: t.jsonl\nmodel_name_or_path: m\nlearnig_rate: 1.0e-5\n")
    (d / "list.yaml").write_text("- a\n- b\n")
    (d / "broken.yaml").write_text("train_file: [unclosed\n")
    (d / "latin1.yaml").write_bytes("train_file: caf\xe9.jsonl\n".encode("latin-1"))
    (d / "latin1.txt").write_bytes("AAA 1.0 2.0##a caf\xe9 person\n".encode("latin-1"))
    (d / "ann.txt").write_text("AAA 1.0 2.0##a person opens the door.\n")
    (d / "empty.txt").write_text("")
    (d / "gt.jsonl").write_text(json.dumps({"video": "v.mp4", "query": "q", "start": 1, "end": 2, "duration": 5,
                                            "qid": "a"}) + "\n")
    (d / "pred_empty.jsonl").write_text("")
    (d / "a_file").write_text("x")
    (d / "folder").mkdir()
    for step in (2, 10):  # a run stopped before its final save: checkpoints only
        (d / "stopped" / f"checkpoint-{step}").mkdir(parents=True)
    return d


def shared(*parts):
    root = shared_dir()
    if root is None:
        pytest.skip("../shared is not available")
    return str(root.joinpath(*parts))


TRAIN = ["train", "--config", str(REPO_ROOT / "configs" / "demo_grpo.yaml")]
SFT = ["sft", "--config", str(REPO_ROOT / "configs" / "demo_sft.yaml")]


def EVAL(d, model=None):  # noqa: N802 - reads as the command it builds
    return ["eval", "--model", str(d / model if model else d), "--data", shared("data", "videos", "annotations.jsonl"),
            "--out", str(d / f"ev_{model}")]


def INFER(d, model=None):  # noqa: N802
    return ["infer", "--model", str(d / model if model else d), "--video",
            shared("data", "videos", "mmaction2_eye_makeup.avi"), "--query", "someone", "--max-frames", "4"]


CASES = {
    "train: typo'd config key": (lambda d: ["train", "--config", str(d / "typo.yaml")],
                                 ["typo.yaml:3: unknown key 'learnig_rate'", "did you mean 'learning_rate'"]),
    "train: unknown flag": (lambda d: ["train", "--config", str(REPO_ROOT / "configs" / "demo_grpo.yaml"),
                                       "--num_generation", "4"], ["unknown option --num_generation",
                                                                  "'--num_generations'"]),
    "train: missing config file": (lambda d: ["train", "--config", str(d / "nope.yaml")], ["nope.yaml: no such"]),
    "train: config not a mapping": (lambda d: ["train", "--config", str(d / "list.yaml")], ["list.yaml: a config"]),
    "train: config not YAML": (lambda d: ["train", "--config", str(d / "broken.yaml")], ["broken.yaml:2: not valid"]),
    "train: config not UTF-8": (lambda d: ["train", "--config", str(d / "latin1.yaml")],
                                ["latin1.yaml: not UTF-8 text (byte 15"]),
    "train: invalid value": (lambda d: ["train", "--config", str(REPO_ROOT / "configs" / "demo_grpo.yaml"),
                                        "--loss_type", "ppo"], ["command line: invalid GroundingGRPOConfig",
                                                                "loss_type 'ppo'"]),
    "sft: typo'd config key": (lambda d: ["sft", "--config", str(d / "typo.yaml")], ["unknown key 'learnig_rate'"]),
    "sft: invalid value": (lambda d: ["sft", "--config", str(REPO_ROOT / "configs" / "demo_sft.yaml"),
                                      "--prompt_template", "nope"], ["command line: invalid", "'nope'"]),
    "prepare: missing --durations file": (
        lambda d: ["prepare", "--format", "charades_sta", "--annotations", str(d / "ann.txt"), "--durations",
                   str(d / "nope.json"), "--out", str(d / "o.jsonl")], ["nope.json: No such file"]),
    "prepare: missing annotation file": (
        lambda d: ["prepare", "--format", "jsonl", "--annotations", str(d / "nope.jsonl"), "--out",
                   str(d / "o.jsonl")], ["nope.jsonl: annotation file not found"]),
    "prepare: non-UTF-8 annotations": (
        lambda d: ["prepare", "--format", "charades_sta", "--annotations", str(d / "latin1.txt"), "--out",
                   str(d / "o.jsonl")], ["latin1.txt: not UTF-8 text (byte 18"]),
    "prepare: wrong format (a 1.7 MB json read as Charades-STA text)": (
        lambda d: ["prepare", "--format", "charades_sta", "--annotations",
                   shared("data", "benchmarks", "activitynet_captions", "val_2.json"), "--out", str(d / "o.jsonl")],
        ["val_2.json:1: expected 'VIDEOID start end##sentence'", "more characters"]),
    "prepare: empty annotation file": (
        lambda d: ["prepare", "--format", "charades_sta", "--annotations", str(d / "empty.txt"), "--out",
                   str(d / "o.jsonl")], ["empty.txt: no usable line"]),
    "prepare: --out is a folder": (
        lambda d: ["prepare", "--format", "jsonl", "--annotations", str(d / "gt.jsonl"), "--out", str(d / "folder")],
        ["folder: --out is a folder"]),
    "prepare: --out under a file (unwritable)": (
        lambda d: ["prepare", "--format", "jsonl", "--annotations", str(d / "gt.jsonl"), "--out",
                   str(d / "a_file" / "o.jsonl")], ["a_file"]),
    "score: missing predictions file": (
        lambda d: ["score", "--predictions", str(d / "nope.jsonl"), "--annotations", str(d / "gt.jsonl")],
        ["nope.jsonl: No such file"]),
    "score: empty predictions file": (
        lambda d: ["score", "--predictions", str(d / "pred_empty.jsonl"), "--annotations", str(d / "gt.jsonl")],
        ["pred_empty.jsonl: no predictions"]),
    "eval: missing data file": (
        lambda d: ["eval", "--model", str(d), "--data", str(d / "nope.jsonl"), "--out", str(d / "ev")],
        ["nope.jsonl: No such file"]),
    "eval: --out under a file (before the model loads)": (
        lambda d: ["eval", "--model", str(d / "tiny"), "--data", shared("data", "videos", "annotations.jsonl"),
                   "--out", str(d / "a_file" / "ev")], ["a_file"]),
    # numeric flags: one line before any model loads (the upper bound once the model's config.json is read)
    "eval: --max-new-tokens 0 (was run with 256)": (
        lambda d: [*EVAL(d), "--max-new-tokens", "0"], ["--max-new-tokens must be ≥ 1 (got 0)"]),
    "eval: --max-new-tokens -5": (lambda d: [*EVAL(d), "--max-new-tokens", "-5"], ["--max-new-tokens must be ≥ 1"]),
    "eval: --max-new-tokens past the model's context": (
        lambda d: [*EVAL(d, "tiny"), "--max-new-tokens", "1000000000"],
        ["--max-new-tokens must be ≤ 32768 (the context of", "max_position_embeddings", "(got 1000000000)"]),
    "eval: --batch-size 0": (lambda d: [*EVAL(d), "--batch-size", "0"], ["--batch-size must be ≥ 1 (got 0)"]),
    "eval: --fps 0": (lambda d: [*EVAL(d), "--fps", "0"], ["--video-fps must be > 0 (got 0.0)"]),
    "eval: --max-pixels -1": (lambda d: [*EVAL(d), "--max-pixels", "-1"], ["--video-max-pixels must be > 0"]),
    "eval: --max-missing-fraction 2": (lambda d: [*EVAL(d), "--max-missing-fraction", "2"],
                                       ["--max-missing-fraction must be ≤ 1.0 (got 2.0)"]),
    "eval: --seed -1": (lambda d: [*EVAL(d), "--seed", "-1"], ["--seed must be ≥ 0"]),
    "difficulty: --batch-size 0": (
        lambda d: ["difficulty", "--model", str(d), "--data", shared("data", "videos", "annotations.jsonl"),
                   "--out", str(d / "scored.jsonl"), "--batch-size", "0"], ["--batch-size must be ≥ 1"]),
    "infer: --max-new-tokens 0": (lambda d: [*INFER(d), "--max-new-tokens", "0"],
                                  ["--max-new-tokens must be ≥ 1 (got 0)"]),
    "infer: --max-new-tokens -5": (lambda d: [*INFER(d), "--max-new-tokens", "-5"], ["--max-new-tokens must be ≥ 1"]),
    "infer: --max-new-tokens past the model's context": (
        lambda d: [*INFER(d, "tiny"), "--max-new-tokens", "1000000000"], ["--max-new-tokens must be ≤ 32768"]),
    "infer: --batch-size 0": (lambda d: [*INFER(d), "--batch-size", "0"], ["--batch-size must be ≥ 1"]),
    "infer: --max-frames 0": (lambda d: [*INFER(d), "--max-frames", "0"], ["--video-max-frames must be > 0"]),
    "infer: empty --query": (lambda d: ["infer", "--model", str(d), "--video", str(d / "a_file"), "--query", ""],
                             ["--query 1 of 1 is empty"]),
    "infer: --gt without --plot (drawn nowhere)": (
        lambda d: [*INFER(d), "--gt", "1", "2"], ["--gt is drawn on the --plot picture only"]),
    "infer: reversed --gt": (lambda d: [*INFER(d), "--gt", "5", "3", "--plot", str(d / "p.png")],
                             ["--gt 1 of 1 (5 3) must be START END in seconds with 0 ≤ START ≤ END"]),
    # argparse's own refusals: one line naming the flag, not the usage block
    "infer: --gt not a number": (lambda d: [*INFER(d), "--gt", "abc", "3"],
                                 ["argument --gt: invalid float value: 'abc'", "grounding-rl infer --help"]),
    "infer: --gt once for two queries": (
        lambda d: [*INFER(d), "--query", "b", "--gt", "1", "2", "--plot", str(d / "p.png")],
        ["--gt was given 1 time(s) for 2 --query"]),
    "eval: --data left out": (lambda d: ["eval", "--model", str(d / "tiny"), "--out", str(d / "ev")],
                              ["the following arguments are required: --data"]),
    "train: a value of the wrong type": (lambda d: [*TRAIN, "--video_fps", "abc"],
                                         ["argument --video_fps/--video-fps: invalid float value: 'abc'"]),
    "infer: whitespace --query": (
        lambda d: [*INFER(d), "--query", " \t"], ["--query 2 of 2 is only whitespace"]),
    "train: per_device_train_batch_size 0": (
        lambda d: [*TRAIN, "--per_device_train_batch_size", "0"], ["per_device_train_batch_size must be ≥ 1"]),
    "train: max_completion_length 0": (lambda d: [*TRAIN, "--max_completion_length", "0"],
                                       ["max_completion_length must be ≥ 1 (got 0)"]),
    "train: max_completion_length past the model's context": (
        lambda d: [*TRAIN, "--model_name_or_path", str(d / "tiny"), "--max_completion_length", "1000000000"],
        ["command line: max_completion_length must be ≤ 31744", "32768 tokens", "max_prompt_length 1024"]),
    "train: video_fps 0": (lambda d: [*TRAIN, "--video_fps", "0"], ["video_fps must be > 0"]),
    "train: max_missing_fraction 2": (lambda d: [*TRAIN, "--max_missing_fraction", "2"],
                                      ["command line: max_missing_fraction must be ≤ 1.0"]),
    "train: min_video_duration above max_video_duration": (
        lambda d: [*TRAIN, "--min_video_duration", "3600", "--max_video_duration", "3"],
        ["command line: min_video_duration 3600.0 is above max_video_duration 3.0"]),
    "sft: max_video_duration -1": (lambda d: [*SFT, "--max_video_duration", "-1"],
                                   ["max_video_duration must be ≥ 0.0 (got -1.0)"]),
    "sft: video_min_pixels 0": (lambda d: [*SFT, "--video_min_pixels", "0"],
                                ["need 0 < video_min_pixels ≤ video_max_pixels (got 0,"]),
    "sft: gradient_accumulation_steps 0": (lambda d: [*SFT, "--gradient_accumulation_steps", "0"],
                                           ["gradient_accumulation_steps must be ≥ 1"]),
    "sft: seed -1": (lambda d: [*SFT, "--seed", "-1"], ["seed must be in [0, 2**32 - 1]"]),
    "prepare: --max-missing-fraction -1": (
        lambda d: ["prepare", "--format", "jsonl", "--annotations", str(d / "gt.jsonl"), "--out", str(d / "o.jsonl"),
                   "--video-root", str(d), "--max-missing-fraction", "-1"], ["--max-missing-fraction must be ≥ 0.0"]),
    # a key written twice in a YAML: the file, the key and both lines
    "train: YAML key written twice": (lambda d: ["train", "--config", str(d / "dup.yaml")],
                                      ["dup.yaml: key 'learning_rate' is written twice (lines 3 and 5)"]),
    "eval: benchmark YAML key written twice": (
        lambda d: [*EVAL(d), "--benchmark", str(d / "dup_bench.yaml")], ["dup_bench.yaml: key 'format' is written"]),
    # broken checkpoints: the file, no traceback (a missing shard and a truncated file before transformers reads them)
    "eval: checkpoint missing a shard": (
        lambda d: [*EVAL(d, "ckpt_missing_shard"), "--limit", "1"],
        ["ckpt_missing_shard/model-00002-of-00002.safetensors: no such shard", "model.safetensors.index.json"]),
    "infer: truncated safetensors file": (
        lambda d: INFER(d, "ckpt_truncated"),
        ["ckpt_truncated/model.safetensors: not a readable safetensors file", "truncated"]),
    "eval: weights of the wrong shapes": (
        lambda d: [*EVAL(d, "ckpt_shapes"), "--limit", "1"],
        ["ckpt_shapes/model.safetensors: the weights do not fit the shapes of its config.json", ".mlp.",
         "_proj.weight: ckpt: torch.Size(", "vs model:torch.Size("]),
    # a --model that names no checkpoint: one line before any output or model load
    "eval: --model does not exist": (lambda d: EVAL(d, "nope_ckpt"), ["nope_ckpt: no such checkpoint folder"]),
    "infer: --model does not exist": (lambda d: INFER(d, "nope_ckpt"), ["nope_ckpt: no such checkpoint folder"]),
    "eval: --model is a folder without config.json": (
        lambda d: EVAL(d, "folder"), ["folder: not a checkpoint folder (no config.json or adapter_config.json)"]),
    "infer: --model is a run stopped before its final save": (
        lambda d: INFER(d, "stopped"), ["stopped: not a checkpoint folder", "its latest checkpoint is",
                                        "stopped/checkpoint-10"]),
    "infer: --model is a file": (lambda d: INFER(d, "a_file"), ["a_file: a file, not a checkpoint folder"]),
    "train: model_name_or_path does not exist": (
        lambda d: [*TRAIN, "--model_name_or_path", str(d / "nope_ckpt"), "--train_file",
                   shared("data", "videos", "annotations.jsonl"), "--max_steps", "1", "--output_dir",
                   str(d / "run_nope")], ["nope_ckpt: no such checkpoint folder"]),
    # the other entry points
    "compare: missing path": (lambda d: ["compare", f"a={d / 'nope.json'}"], ["nope.json: no metrics.json"]),
    "compare: not NAME=PATH": (lambda d: ["compare", str(d / "gt.jsonl")], ["expected NAME=PATH"]),
    "baseline: empty train file": (
        lambda d: ["baseline", "--train", str(d / "pred_empty.jsonl"), "--data", str(d / "gt.jsonl"), "--out",
                   str(d / "b.jsonl")], ["pred_empty.jsonl: no samples"]),
    "baseline: missing data file": (
        lambda d: ["baseline", "--train", str(d / "gt.jsonl"), "--data", str(d / "nope.jsonl"), "--out",
                   str(d / "b.jsonl")], ["nope.jsonl"]),
    "prepare: duplicate qids": (
        lambda d: ["prepare", "--format", "jsonl", "--annotations", str(d / "dup_qids.jsonl"), "--out",
                   str(d / "o.jsonl")], ["dup_qids.jsonl: qid 'a' of query 3 repeats query 1's"]),
    "fits: --gpu-memory 0": (lambda d: ["fits", str(REPO_ROOT / "configs" / "demo_grpo.yaml"), "--gpu-memory", "0"],
                             ["--gpu-memory must be > 0"]),
    "merge-lora: not an adapter": (
        lambda d: ["merge-lora", "--adapter", str(d / "folder"), "--out", str(d / "merged")],
        ["folder: no adapter_config.json"]),
    # ---- newcomer cases: dev tools, compare, fits, merge-lora, train, the dispatcher (rows below this line) ----
    "tiny-model: --like a file": (lambda d: ["tiny-model", "--out", str(d / "tm"), "--like", str(d / "a_file")],
                                  ["a_file: a file, not a model folder"]),
    "tiny-model: --like a folder that is no model": (
        lambda d: ["tiny-model", "--out", str(d / "tm"), "--like", str(d / "folder")],
        ["folder: not a model folder (no config.json)"]),
    "tiny-model: --like beside another --tokenizer": (
        lambda d: ["tiny-model", "--out", str(d / "tm"), "--like", shared("models", "Qwen3-VL-8B-Instruct"),
                   "--tokenizer", shared("models", "Qwen2.5-VL-7B-Instruct")], ["Qwen2.5-VL-7B-Instruct beside --like"]),
    "tiny-model: --num-heads 3 with hidden size 64": (
        lambda d: ["tiny-model", "--out", str(d / "tm"), "--num-heads", "3"],
        ["--hidden-size 64 is not divisible by --num-heads 3"]),
    "tiny-model: --hidden-size 0": (lambda d: ["tiny-model", "--out", str(d / "tm"), "--hidden-size", "0"],
                                    ["--hidden-size must be ≥ 1 (got 0)"]),
    "tiny-model: --from-config without a config": (lambda d: ["tiny-model", "--from-config"],
                                                   ["--from-config needs a training config"]),
    "tiny-model: over a folder it did not write": (
        lambda d: ["tiny-model", "--out", str(d / "stopped"), "--num-layers", "1"],
        ["stopped holds files tiny-model did not write (checkpoint-10/ and 1 more)", "--overwrite"]),
    "demo-data: over a folder it did not write": (
        lambda d: ["demo-data", "--out", str(d / "stopped"), "--num-train", "1", "--num-test", "1"],
        ["stopped holds files demo-data did not write (checkpoint-10/ and 1 more)", "--overwrite"]),
    "compare: a run name given twice": (lambda d: ["compare", f"a={d / 'x'}", f"a={d / 'y'}"],
                                        ["run name 'a' is given twice"]),
    "train: frame_cache_dir is a file (before the model loads)": (
        lambda d: [*TRAIN, "--model_name_or_path", str(d / "tiny"), "--train_file",
                   shared("data", "videos", "annotations.jsonl"), "--output_dir", str(d / "run_fc"),
                   "--frame_cache_dir", str(d / "a_file")], ["frame_cache_dir: ", "a_file is a file, not a folder"]),
    "merge-lora: --dtype fp17": (
        lambda d: ["merge-lora", "--adapter", str(d / "folder"), "--out", str(d / "merged"), "--dtype", "fp17"],
        ["argument --dtype: invalid choice: 'fp17'"]),

    # (end of dev-tools rows)


    # ---- newcomer cases: eval, infer, difficulty (rows below this line) ----
    "eval: --dtype fp17": (lambda d: [*EVAL(d, "tiny"), "--dtype", "fp17"],
                           ["argument --dtype: invalid choice: 'fp17'", "float16"]),
    "infer: --dtype fp17": (lambda d: [*INFER(d, "tiny"), "--dtype", "fp17"], ["argument --dtype: invalid choice"]),
    "infer: --device cuda without a GPU": (lambda d: [*INFER(d, "tiny"), "--device", _absent_cuda()],
                                           ["--device cuda", "use --device cpu"]),
    "eval: --device cuda without a GPU": (lambda d: [*EVAL(d, "tiny"), "--device", _absent_cuda()],
                                          ["--device cuda", "use --device cpu"]),
    "eval: --frame-cache naming a file": (lambda d: [*EVAL(d, "tiny"), "--frame-cache", str(d / "a_file")],
                                          ["--frame-cache", "a_file is a file; give a folder"]),
    "eval: lmms_eval_qwen2_5_vl sampler on a Qwen3-VL model": (
        lambda d: [*EVAL(d, _qwen3(d)), "--video-sampler", "lmms_eval_qwen2_5_vl"],
        ["--video-sampler lmms_eval_qwen2_5_vl is lmms-eval's Qwen2.5-VL backend", "Qwen3-VL checkpoint"]),
    "infer: lmms_eval_qwen2_5_vl sampler on a Qwen3-VL model": (
        lambda d: [*INFER(d, _qwen3(d)), "--video-sampler", "lmms_eval_qwen2_5_vl"],
        ["--video-sampler lmms_eval_qwen2_5_vl", "Qwen3-VL checkpoint"]),
    "eval: --out holding another tool's predictions (KeyError 'gt_start' before)": (
        lambda d: [*EVAL(d, "tiny")[:-1], str(_foreign_out(d))],
        ["foreign_out holds predictions.jsonl and metrics.json not written by eval", "--overwrite"]),
    "infer: --plot with an extension matplotlib cannot write (checked before the answer)": (
        lambda d: [*INFER(d, "tiny"), "--plot", str(d / "p.xyz")], ["--plot", "p.xyz: matplotlib writes no .xyz"]),
    "eval: --video-min-tokens above the maximum (in tokens, not pixels)": (
        lambda d: [*EVAL(d, "tiny"), "--video-min-tokens", "100000"],
        ["--video-min-tokens 100000 is above the per-frame maximum of 768 merged tokens", "--video-max-pixels"]),
    "eval: --video-max-frames under the minimum (--video-min-frames lowers it)": (
        lambda d: [*EVAL(d, "tiny"), "--video-max-frames", "3"],
        ["--video-max-frames 3 is under the minimum of 4 frames", "give --video-min-frames 3 or lower"]),
    "infer: --max-frames under the minimum": (lambda d: [*INFER(d, "tiny"), "--max-frames", "2"],
                                              ["--video-max-frames 2 is under the minimum of 4"]),
    "difficulty: --temperature without --num-rollouts (ignored before)": (
        lambda d: ["difficulty", "--model", str(d / "tiny"), "--data", shared("data", "videos", "annotations.jsonl"),
                   "--out", str(d / "scored.jsonl"), "--temperature", "0.7"],
        ["--temperature 0.7 samples the --num-rollouts rollouts", "give --num-rollouts K"]),

    # (end of eval rows)


    # ---- newcomer cases: prepare, data, video (rows below this line) ----
    "prepare: a lone surrogate in a query": (
        lambda d: _prepare_jsonl(d, "surrogate.jsonl", '{"video": "v.mp4", "query": "\\ud800 opens", "start": 1, '
                                 '"end": 2, "duration": 5}'), ["surrogate.jsonl:1: a lone surrogate \\ud800"]),
    "prepare: a lone surrogate in a json file": (
        lambda d: ["prepare", "--format", "time_r1", "--annotations", _file(
            d / "surrogate.json", '[{"video": "v.mp4", "sentence": "\\udc00", "timestamp": [1, 2], "duration": 5}]'),
                   "--out", str(d / "o.jsonl")], ["surrogate.json: holds a lone surrogate \\udc00"]),
    **{f"prepare: qid {text}": (
        lambda d, text=text: _prepare_jsonl(d, "qid.jsonl", '{"video": "v.mp4", "query": "q", "start": 1, "end": 2, '
                                            f'"duration": 5, "qid": {text}}}'),
        [f"qid.jsonl:1: qid must be a string or an integer, got {text}"]) for text in ("1.0", "true", "[1]")},
    "prepare: spans and start/end disagree": (
        lambda d: _prepare_jsonl(d, "spans.jsonl", '{"video": "v.mp4", "query": "q", "spans": [[1, 2], [4, 5]], '
                                 '"start": 10, "end": 12, "duration": 15}'),
        ["spans.jsonl:1: spans [[1.0, 2.0], [4.0, 5.0]] and start/end 10-12 disagree", "hull 1-5"]),
    "prepare: a folder named as the video": (
        lambda d: _prepare_jsonl(d, "folder_video.jsonl", '{"video": "folder", "query": "q", "start": 1, "end": 2}'),
        ["folder: is a folder, not a video file"]),
    "prepare: --format and --annotations missing": (
        lambda d: ["prepare", "--out", str(d / "o.jsonl")], ["give --format and --annotations, or --benchmark"]),

    # (end of data rows)

    # ---- answering modes (eval, infer, difficulty, validation) (rows below this line) ----


    # ---- reports and pictures (eval's report, plot) (rows below this line) ----


    # ---- several machines (rows below this line) ----


    # ---- trackers, curves and quiet output (rows below this line) ----
    "train: report_to a tracker not installed": (
        lambda d: ["train", "--config", str(REPO_ROOT / "configs" / "demo_grpo.yaml"), "--report_to", "swanlab",
                   "--output_dir", str(d / "no_run")], ["command line: report_to 'swanlab'", "pip install swanlab"]),
    "train: report_to a misspelt tracker": (
        lambda d: ["train", "--config", str(REPO_ROOT / "configs" / "demo_grpo.yaml"), "--report_to", "tensorbord",
                   "--output_dir", str(d / "no_run")], ["report_to 'tensorbord' is not a tracker", "tensorboard"]),
    "plot: a folder that is not a run": (lambda d: ["plot", str(d / "folder"), "--out", str(d / "c.png")],
                                         ["folder: no trainer_state.json"]),
    "plot: a picture format matplotlib cannot write": (
        lambda d: ["plot", str(d / "folder"), "--out", str(d / "c.xyz")], ["--out", "c.xyz: matplotlib writes no"]),


    # ---- hub push and model card (rows below this line) ----
    "train: push_to_hub offline": (lambda d: [*TRAIN, "--push_to_hub", "true", "--hub_model_id", "me/run"],
                                   ["command line: push_to_hub: true needs the Hub, but HF_HUB_OFFLINE is set"]),
    "sft: hub_model_id without push_to_hub": (
        lambda d: [*SFT, "--hub_model_id", "me/run"],
        ["command line: hub_model_id 'me/run' is set without push_to_hub: true"]),
    "sft: hub_always_push": (lambda d: [*SFT, "--push_to_hub", "true", "--hub_always_push", "true"],
                             ["hub_always_push True is refused: every push here waits for the one before"]),
    # ---- check (rows below this line) ----
    "check: --video without --query": (lambda d: ["check", "--config", str(REPO_ROOT / "configs" / "demo_grpo.yaml"),
                                                  "--video", "a.mp4"], ["--video and --query go together"]),
    "check: --limit 0": (lambda d: ["check", "--config", str(REPO_ROOT / "configs" / "demo_grpo.yaml"), "--limit",
                                    "0"], ["--limit must be ≥ 1 (got 0)"]),
    "check: --model not a folder": (lambda d: ["check", "--model", str(d / "nope"), "--video", "a.mp4", "--query",
                                               "q"], ["--model", "nope: no such folder"]),
    "check: --json in a missing folder": (lambda d: ["check", "--config", str(REPO_ROOT / "configs" /
                                                                              "demo_grpo.yaml"),
                                                     "--json", str(d / "no" / "c.json")], ["--json", "folder"]),
    # ---- recipes: their fields parsed as their own dataclasses (rows below this line) ----
    "train: typo'd recipe key": (
        lambda d: (d.joinpath("recipe_typo.yaml").write_text("learning_rate: 1.0e-6\nonline_dificulty_range: [0.0, 0.7]\n"),
                   ["train", "--config", str(d / "recipe_typo.yaml")])[1],
        ["recipe_typo.yaml:2: unknown key 'online_dificulty_range'", "did you mean 'online_difficulty_range'"]),
    "train: typo'd recipe flag": (lambda d: [*TRAIN, "--dynamic_sampleing", "true"],
                                  ["unknown option --dynamic_sampleing", "'--dynamic_sampling'"]),
    "train: invalid recipe value": (lambda d: [*TRAIN, "--max_num_gen_batches", "0"],
                                    ["command line: invalid GroundingGRPOConfig",
                                     "max_num_gen_batches must be ≥ 1 (got 0)"]),
    "train: recipes that conflict": (lambda d: [*TRAIN, "--two_pass_zoom", "true", "--use_gt_injection", "true"],
                                     ["command line: invalid", "two_pass_zoom does not run with use_gt_injection"]),
    # ---- wtC: the preprocessing overrides made from the declared settings (rows below this line) ----
    "infer: --video-total-tokens 0": (lambda d: [*INFER(d), "--video-total-tokens", "0"],
                                      ["--video-total-tokens must be > 0 (got 0)"]),
    "eval: an unknown --video-sampler": (lambda d: [*EVAL(d), "--video-sampler", "linspace"],
                                         ["argument --video-sampler: invalid choice: 'linspace'", "exact"]),
    # ---- wtE: the crop-call limit is --max-tool-calling-iterations, --max-turns its alias (rows below this line) ----
    "infer: --max-turns -1 (the alias)": (lambda d: [*INFER(d), "--max-turns", "-1"],
                                          ["--max-tool-calling-iterations must be ≥ 0 (got -1)"]),
    "eval: --max-tool-calling-iterations -1": (lambda d: [*EVAL(d), "--max-tool-calling-iterations", "-1"],
                                               ["--max-tool-calling-iterations must be ≥ 0 (got -1)"]),
    # ---- wtP: the one-experiment options became presets or went (rows below this line) ----
    "train: an unknown difficulty_sampling preset": (
        lambda d: [*TRAIN, "--difficulty_sampling", "gaussian"],
        ["invalid GroundingGRPOConfig", "difficulty_sampling 'gaussian' is not one of ('none', 'timelens', "
                                        "'dispersion')"]),
    "train: an unknown reward_shaping preset": (
        lambda d: [*TRAIN, "--reward_shaping", "exp"],
        ["invalid GroundingGRPOConfig", "reward_shaping 'exp' is not one of ('none', 'tempsamp')"]),
    "train: a key difficulty_sampling fixes": (
        lambda d: ["train", "--config", _file(d / "gauss.yaml",
                                              "learning_rate: 1.0e-6\ndifficulty_gaussian_mean: 0.1\n")],
        ["gauss.yaml:2: difficulty_gaussian_mean is fixed by difficulty_sampling: timelens (TimeLens's 0.05); "
         "drop it"]),
    "train: a flag reward_shaping fixes": (
        lambda d: [*TRAIN, "--reward_shaping_alpha", "2"],
        ["command line: --reward_shaping_alpha is fixed by reward_shaping: tempsamp (TempSamp-R1's α 1.0); drop it"]),
    "distill: a removed key": (
        lambda d: ["distill", "--config", _file(d / "dz.yaml", "learning_rate: 1.0e-6\ndrop_zero_std_groups: true\n")],
        ["dz.yaml:2: drop_zero_std_groups was removed: groups with equal rewards have advantage 0; dynamic_sampling "
         "resamples them"]),
    "sft: a removed flag": (lambda d: [*SFT, "--check_first_batch", "false"],
                            ["command line: --check_first_batch was removed: the cheap check always runs before the "
                             "first step; drop it"]),
    # ---- wtC: the answering-mode settings declared once, their check written once (rows below this line) ----
    "train: zoom_margin -1": (lambda d: [*TRAIN, "--zoom_margin", "-1"],
                              ["command line: invalid", "zoom_margin must be ≥ 0 (got -1.0)"]),
    "infer: --zoom-time without --zoom": (lambda d: [*INFER(d), "--zoom-time", "video"],
                                          ["--zoom-time given without --zoom"]),
    # ---- a bad value is placed where it was given: the YAML's line, or the command line (rows below this line) ----
    "train: a bad value in the YAML names its line": (
        lambda d: ["train", "--config", _file(d / "ppo.yaml", "learning_rate: 1.0e-6\nloss_type: ppo\n"),
                   "--output_dir", str(d / "no_run")], ["ppo.yaml:2: invalid GroundingGRPOConfig", "loss_type 'ppo'"]),
    "sft: a bad number in the YAML names its line": (
        lambda d: ["sft", "--config", _file(d / "miss.yaml", "# a comment\ntrain_file: t.jsonl\n"
                                                         "max_missing_fraction: 2\nmodel_name_or_path: m\n"), "--learning_rate", "1e-5"],
        ["miss.yaml:3: max_missing_fraction must be ≤ 1.0"]),
    "sft: a negative crop-call limit": (lambda d: [*SFT, "--max_tool_calling_iterations", "-2"],
                                        ["command line: invalid", "max_tool_calling_iterations must be ≥ 0 (got -2)"]),
    # ---- wtN: a newcomer's audit for silent wrongs (rows below this line) ----
    "prepare: start/end edited, raw_start/raw_end left as they were": (
        lambda d: _prepare_jsonl(d, "edited.jsonl", json.dumps({"video": "v.mp4", "query": "q", "start": 3, "end": 5.5,
                                                                "duration": 35.2, "raw_start": 2, "raw_end": 4.5})),
        ["edited.jsonl:1: start/end 3-5.5 disagree with raw_start/raw_end 2-4.5 (clamped into the 35.2 s video: "
         "2-4.5), which the standard scoring uses"]),
    "score: predictions in another tool's keys (every query would be a parse failure)": (
        lambda d: ["score", "--annotations", str(d / "gt.jsonl"), "--predictions",
                   _file(d / "pred_keys.jsonl", '{"qid": "a", "pred_start": 1.0, "pred_end": 2.0}\n')],
        ["pred_keys.jsonl:1: qid 'a' has no prediction: none of answer, start, end, pred_spans (its keys: qid, "
         "pred_start, pred_end)"]),
    "score: a start without its end (the start would be ignored)": (
        lambda d: ["score", "--annotations", str(d / "gt.jsonl"), "--predictions",
                   _file(d / "pred_half.jsonl", '{"qid": "a", "start": 1.0, "answer": "<answer>1 to 2</answer>"}\n')],
        ["pred_half.jsonl:1: qid 'a' has only one of 'start' and 'end'; give both (seconds), or neither"]),
    # ---- flags that were parsed and changed nothing, or gave a silent null (rows below this line) ----
    "prepare: --max-missing-fraction without --video-root": (
        lambda d: ["prepare", "--format", "jsonl", "--annotations", str(d / "gt.jsonl"), "--out", str(d / "o.jsonl"),
                   "--max-missing-fraction", "0.5"], ["--max-missing-fraction goes with --video-root"]),
    "score: an unknown --prompt-template": (
        lambda d: ["score", "--predictions", str(d / "pred_empty.jsonl"), "--annotations", str(d / "gt.jsonl"),
                   "--prompt-template", "nope"], ["argument --prompt-template: invalid choice: 'nope'"]),
    "compare: a --json-key naming no run": (lambda d: ["compare", f"a={_foreign_out(d)}", "--json-key", "b:mIoU"],
                                            ["--json-key 'b:mIoU': expected NAME:METRIC with NAME one of a"]),
    "compare: a --json-key naming no metric": (lambda d: ["compare", f"a={_foreign_out(d)}", "--json-key", "a:miou"],
                                               ["--json-key 'a:miou': run 'a' has no metric 'miou'"]),
    "score: predictions for another data file": (
        lambda d: ["score", "--predictions", _file(d / "pred_other.jsonl", '{"qid": "other:1", "answer": "1 to 2"}\n'),
                   "--annotations", str(d / "gt.jsonl")], ["pred_other.jsonl: none of its 1 qids is a query of"]),
    "score: a misspelt canonical key": (
        lambda d: ["score", "--predictions", str(d / "pred_empty.jsonl"), "--annotations",
                   _file(d / "typo_gt.jsonl", '{"video": "v.mp4", "query": "q", "start": 1, "end": 2, "duration": 5, '
                                              '"Spans": [[1, 2], [3, 4]]}\n')],
        ["typo_gt.jsonl:1: unknown key 'Spans' (did you mean 'spans'? it would be ignored)"]),
    "score: spans edited, raw_spans left as they were": (
        lambda d: ["score", "--predictions", str(d / "pred_empty.jsonl"), "--annotations",
                   _file(d / "stale_spans.jsonl", '{"video": "v.mp4", "query": "q", "duration": 10, "spans": [[1, 2]], '
                                                  '"raw_spans": [[5, 6], [6, 7]]}\n')],
        ["stale_spans.jsonl:1: spans [[1.0, 2.0]] disagree with raw_spans [[5.0, 6.0], [6.0, 7.0]] (validated: "
         "[[5.0, 7.0]]), which the qvhighlights scoring uses"]),
    # ---- wtD: eval compares the annotations' durations with the clips' (rows below this line) ----
    "eval: a canonical file in milliseconds (every IoU 0 before)": (
        lambda d: [*EVAL(d, "tiny")[:4], _in_milliseconds(d), *EVAL(d, "tiny")[5:], "--video-root",
                   shared("data", "videos")],
        ["ms.jsonl: 15 of 15 durations differ from their video's by a factor outside [0.5, 2] (qid '0': 35200 s, "
         "charades_OHOFG.mp4 lasts 35.14 s; also qid '1', '2', …): milliseconds or frames, not seconds?"]),
    "train: a canonical file in milliseconds (before the model loads)": (
        lambda d: [*TRAIN, "--model_name_or_path", str(d / "tiny"), "--train_file", _in_milliseconds(d),
                   "--video_root", shared("data", "videos"), "--output_dir", str(d / "run_ms")],
        ["ms.jsonl: 15 of 15 durations differ from their video's by a factor outside [0.5, 2] (qid '0': 35200 s"]),
    # ---- wtT: a newcomer's audit for silent wrongs, training and inference side (rows below this line) ----
    "merge-lora: --out a folder holding a model (the base itself; was overwritten)": (
        lambda d: ["merge-lora", "--adapter", (d / "lora").mkdir(exist_ok=True)
                   or str(Path(_file(d / "lora" / "adapter_config.json", "{}")).parent), "--out", str(d / "tiny")],
        ["tiny already holds files (", "the merged model would be written over them: give a new or empty folder"]),
    "infer: --gt after the clip's end (was drawn nowhere)": (
        lambda d: [*INFER(d, "tiny"), "--gt", "20", "30", "--plot", str(d / "gt.png")],
        ["--gt 1 of 1 (20 30) starts at or after the end of ", "mmaction2_eye_makeup.avi (6.56 s): nothing of it"]),
    # ---- the lead: the rest of the training-side audit (rows below this line) ----
    "plot: the same run given twice (was drawn as two runs)": (
        lambda d: ["plot", str(d / "folder"), str(d / "folder") + "/", "--out", str(d / "c.png")],
        ["folder/ is given twice; name each run once"]),
    "demo-data: --min-duration below 3 (its folder was made first, then a rerun refused)": (
        lambda d: ["demo-data", "--out", str(d / "dd"), "--min-duration", "2"],
        ["need 3 <= min_duration <= max_duration, got 2.0"]),
    "check: a rollout threshold with --skip-rollout (parsed, changed nothing)": (
        lambda d: ["check", "--config", str(REPO_ROOT / "configs" / "demo_grpo.yaml"), "--skip-rollout",
                   "--check-threshold-mean", "0.5"],
        ["--check-threshold-mean judges the rollout check, which --skip-rollout leaves out; drop one"]),
}


@pytest.mark.parametrize("name", list(CASES))
def test_a_user_mistake_is_one_line_and_exit_2(name, files, capsys):
    make_argv, expected = CASES[name]
    argv = make_argv(files)
    assert cli(argv) == 2
    err = capsys.readouterr().err
    # transformers' own progress bar of a model that began to load is not an error line
    lines = [line for line in err.strip().splitlines() if not line.startswith("Loading weights")]
    assert len(lines) == 1, err
    assert lines[0].startswith(f"grounding-rl {argv[0]}: error: ") and "Traceback" not in err
    for text in expected:
        assert text in lines[0], lines[0]
    assert len(lines[0]) < 400
    if argv[0] == "eval" and "--model" in argv and "ckpt_" not in argv[argv.index("--model") + 1]:
        assert not (files / f"ev_{Path(argv[argv.index('--model') + 1]).name}" / "predictions.jsonl").exists()


def test_a_hub_id_not_in_the_offline_cache_is_one_line(files, monkeypatch, capsys):
    """``org/name`` that is no folder here: offline, it must be in the Hub cache (one line, not transformers'
    traceback); the relative path a user mistyped has that form too."""
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.chdir(files)
    assert cli(["infer", "--model", "outputs/typo-run", "--video", shared("data", "videos", "mmaction2_eye_makeup.avi"),
                "--query", "someone"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("grounding-rl infer: error: outputs/typo-run: no such checkpoint folder, and no Hub model of that "
                   "id in the local cache (HF_HUB_OFFLINE is set)")


def test_debug_shows_the_traceback(files, monkeypatch):
    argv = CASES["train: typo'd config key"][0](files)
    with pytest.raises(UserError, match="unknown key 'learnig_rate'"):
        cli([*argv, "--debug"])
    monkeypatch.setenv("GROUNDING_RL_DEBUG", "1")
    with pytest.raises(FileNotFoundError):
        cli(CASES["score: missing predictions file"][0](files))


def test_programming_errors_still_raise(monkeypatch):
    import grounding_rl.cli.compare as compare

    monkeypatch.setattr(compare, "main", lambda argv: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        cli(["compare"])


def test_train_help_starts_with_the_config_usage(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli(["train", "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: grounding-rl train --config CONFIG.yaml [--key value ...]")
    assert "configs/README.md" in out.split("options:")[0]
    assert Path(REPO_ROOT / "configs" / "README.md").is_file()


def test_missing_videos_fail_above_max_missing_fraction(tmp_path, capsys):
    """11 of 12 videos missing (a wrong --video-root): prepare, eval and train stop with the count and first paths;
    with max_missing_fraction 1.0 prepare goes on and reports the count."""
    from grounding_rl.data.missing import check_fraction

    rows = [{"video": f"v{i:02d}.mp4", "query": "q", "start": 1.0, "end": 2.0, "duration": 5.0, "qid": str(i)}
            for i in range(12)]
    (tmp_path / "v00.mp4").write_bytes(b"")  # one exists
    ann = tmp_path / "ann.jsonl"
    ann.write_text("".join(json.dumps(r) + "\n" for r in rows))
    base = ["prepare", "--format", "jsonl", "--annotations", str(ann), "--video-root", str(tmp_path), "--out",
            str(tmp_path / "o.jsonl")]
    assert cli(base) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "11 of 12 videos (92 %, more than max_missing_fraction 0.05), e.g. " in err and "v01.mp4" in err
    assert not (tmp_path / "o.jsonl").exists()
    assert cli([*base, "--max-missing-fraction", "1.0"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["missing_videos"] == 11

    assert cli(["eval", "--model", str(tmp_path), "--data", str(ann), "--out", str(tmp_path / "ev")]) == 2
    assert "missing 11 of 12 videos" in capsys.readouterr().err
    assert not (tmp_path / "ev").exists()  # found before the model loads or anything is written
    assert cli(["train", "--config", str(REPO_ROOT / "configs" / "demo_grpo.yaml"), "--train_file", str(ann),
                "--output_dir", str(tmp_path / "tr")]) == 2
    assert "missing 11 of 12 videos" in capsys.readouterr().err

    check_fraction(["a"], 20, 0.05, "x")  # 5 % is allowed
    with pytest.raises(UserError, match="2 of 20 videos"):
        check_fraction(["a", "b"], 20, 0.05, "x")
    check_fraction(["a"] * 20, 20, 1.0, "x")  # 1.0 never fails


def test_benchmark_files_come_from_the_data_root(tmp_path, monkeypatch, capsys):
    """evaluation/*.yaml name annotation files under --data-root, else $GROUNDING_RL_DATA, else the test data; with
    none of them the error says how to set it (one line, exit 2, from ``grounding-rl prepare --benchmark``)."""
    import grounding_rl.paths as paths
    from grounding_rl.cli import main
    from grounding_rl.eval import benchmarks

    yaml_path = str(REPO_ROOT / "evaluation" / "charades_sta_test.yaml")
    bench = benchmarks.load_benchmark(yaml_path, build_protocol=False, data_root_dir=str(tmp_path))
    assert bench.annotations == str(tmp_path / "charades_sta" / "charades_sta_test.txt")
    assert bench.durations == str(tmp_path / "charades_sta" / "charades.json")
    monkeypatch.setenv("GROUNDING_RL_DATA", str(tmp_path / "env"))
    assert benchmarks.load_benchmark(yaml_path).annotations == str(tmp_path / "env" / "charades_sta" /
                                                                   "charades_sta_test.txt")
    monkeypatch.delenv("GROUNDING_RL_DATA")
    monkeypatch.setattr(paths, "shared_dir", lambda: None)
    assert main(["prepare", "--benchmark", yaml_path, "--out", str(tmp_path / "o.jsonl"), "--video-root", "v"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "GROUNDING_RL_DATA" in err and "--data-root" in err


def test_prepare_from_a_benchmark(tmp_path, shared, capsys):
    """``prepare --benchmark`` reads the YAML's format, annotations and durations: Charades-STA test keeps its 3,720
    queries; a video root is required, and --format beside --benchmark is refused (one line, exit 2)."""
    from grounding_rl.cli import main

    yaml_path = str(REPO_ROOT / "evaluation" / "charades_sta_test.yaml")
    out = tmp_path / "test.jsonl"
    assert main(["prepare", "--benchmark", yaml_path, "--out", str(out)]) == 2
    assert "video_root" in capsys.readouterr().err
    assert main(["prepare", "--benchmark", yaml_path, "--format", "jsonl", "--out", str(out)]) == 2
    assert "--format" in capsys.readouterr().err
    assert main(["prepare", "--benchmark", yaml_path, "--out", str(out), "--video-root", str(tmp_path),
                 "--max-missing-fraction", "1.0"]) == 0
    counts = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    videos = {json.loads(line)["video"] for line in out.read_text().splitlines()}
    assert counts["kept"] == 3720 and counts["missing_videos"] == len(videos) > 1000  # none under the empty root


def test_script_usage_texts_are_clean():
    import subprocess

    for script in ("eval.sh", "infer.sh"):
        proc = subprocess.run(["bash", str(REPO_ROOT / "scripts" / script)], capture_output=True, text=True)
        assert proc.returncode == 2, script
        assert proc.stderr.lstrip().startswith("Evaluate a checkpoint" if script == "eval.sh" else "Ask when")
        assert "set -euo" not in proc.stderr and "#" not in proc.stderr.splitlines()[0], proc.stderr


def test_yaml_keys_written_twice_and_merge_keys(tmp_path):
    """A repeated key is refused at any depth, naming both lines; a key brought in by a merge may be overridden."""
    from grounding_rl.yaml_files import DuplicateKeyError, load_yaml_text

    assert load_yaml_text("base: &b {k: 1, j: 2}\nrun:\n  <<: *b\n  k: 3\n") == {"base": {"k": 1, "j": 2},
                                                                                "run": {"k": 3, "j": 2}}
    assert load_yaml_text("a: 1\n'1': x\n1: y\n") == {"a": 1, "1": "x", 1: "y"}  # a string and an int differ
    with pytest.raises(DuplicateKeyError, match=r"f.yaml: key 'lr' is written twice \(lines 3 and 4\)"):
        load_yaml_text("top:\n  a: 1\n  lr: 1\n  lr: 2\n", "f.yaml")


def test_context_length_comes_from_config_json(tmp_path, qwen_processor_dir, qwen3_processor_dir):
    """Qwen2.5-VL names its context at the top level, Qwen3-VL in text_config; a LoRA folder reads its base's; a
    folder without a config gets the stated constant."""
    from grounding_rl.models.loading import DEFAULT_CONTEXT_TOKENS, context_length

    assert context_length(str(qwen_processor_dir))[0] == 128000
    assert context_length(str(qwen3_processor_dir))[0] == 262144
    (tmp_path / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": str(qwen3_processor_dir)}))
    assert context_length(str(tmp_path))[0] == 262144
    tokens, source = context_length(str(tmp_path / "absent"))
    assert tokens == DEFAULT_CONTEXT_TOKENS == 32768 and "has no readable config.json" in source


def _file(path: Path, text: str) -> str:
    """Write ``text`` to ``path``; return the path as a string (a CASES row's input file)."""
    path.write_text(text)
    return str(path)


def _prepare_jsonl(d: Path, name: str, line: str) -> list[str]:
    """``prepare --format jsonl`` of a one-line annotation file ``d/name``."""
    return ["prepare", "--format", "jsonl", "--annotations", _file(d / name, line + "\n"), "--out", str(d / "o.jsonl")]


def test_prepare_drops_a_query_of_invisible_characters(tmp_path, capsys, caplog):
    """A query of zero-width spaces is as empty as a blank one: dropped and counted, the qid named in the log."""
    ann = _file(tmp_path / "a.jsonl", "".join(json.dumps({"video": "v.mp4", "query": q, "start": 1, "end": 2,
                                                         "duration": 5, "qid": i}) + "\n"
                                              for i, q in enumerate(["\u200b\u200b", "\u00a0", "person \u200bsits"])))
    assert cli(["prepare", "--format", "jsonl", "--annotations", ann, "--out", str(tmp_path / "o.jsonl")]) == 0
    counts = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (counts["kept"], counts["dropped"]) == (1, 2)
    assert "dropped: empty query (only invisible characters: '\\u200b\\u200b') (qid 0" in caplog.text


def _absent_cuda() -> str:
    """A CUDA device this machine lacks: ``cuda`` without a GPU, else an index past the last."""
    import torch

    return "cuda" if not torch.cuda.is_available() else f"cuda:{torch.cuda.device_count()}"


def _qwen3(d: Path) -> str:
    """``d/qwen3``: the real Qwen3-VL config and processor files (no weights; the sampler is refused before a load)."""
    if not (d / "qwen3").exists():
        (d / "qwen3").symlink_to(shared("models", "Qwen3-VL-8B-Instruct"))
    return "qwen3"


def _foreign_out(d: Path) -> Path:
    """A folder holding ``grounding-rl score``'s input and output (no ``eval_config.json``, rows without gt_start)."""
    out = d / "foreign_out"
    out.mkdir(exist_ok=True)
    (out / "predictions.jsonl").write_text(json.dumps({"qid": "0", "answer": "1 to 2"}) + "\n")
    (out / "metrics.json").write_text("{}\n")
    return out


def test_transformers5_layout_on_an_untested_transformers_is_one_line(files, monkeypatch, capsys):
    """``--video-layout transformers5`` under transformers 5.25.0 (outside the tested range) is one
    line naming the flag, the installed version and the range, before anything is written."""
    import importlib.metadata

    original = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version",
                        lambda name: "5.25.0" if name == "transformers" else original(name))
    for argv in ([*EVAL(files, _qwen3(files)), "--video-layout", "transformers5"],
                 [*INFER(files, _qwen3(files)), "--video-layout", "transformers5"]):
        assert cli(argv) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"grounding-rl {argv[0]}: error: --video-layout transformers5 needs transformers >= "
                              "5.19, < 5.25 (the tested range); transformers 5.25.0 is installed"), err
        assert len(err.splitlines()) == 1
    assert not (files / "ev_qwen3").exists()


def _in_milliseconds(d: Path) -> str:
    """``d/ms.jsonl``: the real clips' canonical annotations with every time and duration ×1000."""
    rows = [json.loads(line) for line in Path(shared("data", "videos", "annotations.jsonl")).read_text().splitlines()]
    return _file(d / "ms.jsonl", "".join(json.dumps({**r, **{k: 1000 * r[k] for k in ("start", "end", "duration")}})
                                         + "\n" for r in rows))


def test_demo_data_refuses_its_durations_before_writing(tmp_path, capsys):
    """``demo-data --min-duration 2``: refused before its folder is made (it made ``videos/`` first, and the rerun
    with good values was then refused as a folder holding files demo-data did not write)."""
    assert cli(["demo-data", "--out", str(tmp_path / "dd"), "--min-duration", "2"]) == 2
    assert "need 3 <= min_duration <= max_duration" in capsys.readouterr().err
    assert not (tmp_path / "dd").exists()
