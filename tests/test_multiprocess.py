"""Multi-process GRPO: 2 CPU processes under DeepSpeed ZeRO-3 with β > 0, and 1 process with LoRA.

Each test launches ``grounding-rl train`` (``grounding_rl.cli.train.main``) through ``accelerate launch`` from the
venv, on the tiny model and real clips, with a reward with spread given as ``tests/conftest.py:varied_reward`` (a user's
own function, loaded the same way on every rank; the random tiny model never earns IoU/format rewards, which would
leave every advantage at 0) and a worker that writes what each rank saw.
"""
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from grounding_rl.paths import REPO_ROOT

REWARD_SPEC = f"{REPO_ROOT / 'tests' / 'conftest.py'}:varied_reward"

WORKER = '''
import json, sys
import torch
torch.set_num_threads(1)
import grounding_rl.update.trainer as trainer_module

seen = {}
original_train = trainer_module.GroundingGRPOTrainer.train
def train(self, *args, **kwargs):
    seen["trainer"] = self
    return original_train(self, *args, **kwargs)
trainer_module.GroundingGRPOTrainer.train = train

from grounding_rl.cli.train import main
rc = main(sys.argv[2:])
t = seen["trainer"]
ref = t.ref_model
params = lambda m: list(m.parameters()) if m is not None else []
report = {
    "rc": rc, "rank": t.accelerator.process_index, "world_size": t.accelerator.num_processes,
    "deepspeed": bool(t.is_deepspeed_enabled),
    "zero_stage": t.accelerator.state.deepspeed_plugin.zero_stage if t.is_deepspeed_enabled else None,
    "policy_type": type(t.model_wrapped).__name__,
    "ref_type": type(ref).__name__ if ref is not None else None,
    "ref_sharded": sum(1 for p in params(ref) if hasattr(p, "ds_id") and p.numel() == 0),
    "policy_sharded": sum(1 for p in params(t.model_wrapped) if hasattr(p, "ds_id") and p.numel() == 0),
    "peft": hasattr(t.accelerator.unwrap_model(t.model), "peft_config"),
    "logs": [h for h in t.state.log_history if "loss" in h],
    "reward_names": t.reward_func_names,
    "global_step": t.state.global_step,
}
with open(f"{sys.argv[1]}.rank{report['rank']}.json", "w") as f:
    json.dump(report, f)
'''


CONFIGS = {"qwen2_5_vl": "tiny_real_clips.yaml", "qwen3_vl": "tiny_real_clips_qwen3_vl.yaml"}


def _launch(tmp_path, tiny_model_dir, launcher_args, train_args, timeout, out=None, worker_source=WORKER, env_extra=(),
            killed=False):
    """``accelerate launch`` the worker; it must exit 0 (or, with ``killed``, not 0: a fault was injected)."""
    worker = tmp_path / "worker.py"
    worker.write_text(worker_source)
    report = tmp_path / "report"
    out = out or tmp_path / "out"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu",
           "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": str(REPO_ROOT), **dict(env_extra)}
    accelerate = Path(sys.executable).parent / "accelerate"
    cmd = [str(accelerate), "launch", *launcher_args, str(worker), str(report),
           "--config", str(REPO_ROOT / "configs" / CONFIGS[_family(tiny_model_dir)]),
           "--model_name_or_path", str(tiny_model_dir), "--output_dir", str(out),
           "--reward_funcs", REWARD_SPEC, "--reward_weights", "1.0", "--learning_rate", "1e-3",
           "--max_completion_length", "8", "--max_steps", "2", *train_args]
    proc = subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert (proc.returncode != 0) if killed else (proc.returncode == 0), proc.stdout[-3000:] + proc.stderr[-6000:]
    files = sorted(tmp_path.glob("report.rank*.json"))
    return files, proc


def _family(model_dir) -> str:
    from grounding_rl.family import family_of_checkpoint

    return family_of_checkpoint(model_dir).name


@pytest.mark.slow
def test_two_processes_zero3_with_reference_model(tmp_path, family_model_dir, videos_dir):
    tiny_model_dir = family_model_dir
    files, _ = _launch(tmp_path, tiny_model_dir,
                       ["--config_file", str(REPO_ROOT / "configs" / "accelerate" / "zero3.yaml"),
                        "--num_processes", "2"],
                       ["--per_device_train_batch_size", "2", "--beta", "0.04"], timeout=600)
    reports = [json.loads(f.read_text()) for f in files]
    assert [r["rank"] for r in reports] == [0, 1]  # both ranks finished
    for r in reports:
        assert (r["world_size"], r["deepspeed"], r["zero_stage"], r["global_step"]) == (2, True, 3, 2)
        assert r["policy_type"] == "DeepSpeedEngine" and r["ref_type"] == "DeepSpeedEngine"
        assert r["reward_names"] == [REWARD_SPEC] and "rewards/" + REWARD_SPEC + "/mean" in r["logs"][0]
        assert r["ref_sharded"] > 0 and r["policy_sharded"] > 0  # ZeRO-3 partitions both models
        losses = [h["loss"] for h in r["logs"]]
        assert len(losses) == 2 and all(math.isfinite(x) for x in losses)
        assert r["logs"][0]["kl"] == pytest.approx(0.0, abs=1e-6)  # π_θ = π_ref before the first update
        assert r["logs"][1]["kl"] > 1e-5  # the update moved the policy away from the sharded reference
    assert reports[0]["logs"] == reports[1]["logs"]  # metrics are reduced across ranks
    assert json.loads((tmp_path / "out" / "grounding_config.json").read_text())["reward_funcs"] == [REWARD_SPEC]


# The crop tool's turns on two ranks that differ: rank 0's first turn requests crop(1, 3) (scripted: a random model
# emits no tool call), its second turn is sampled from the conversation with the window; rank 1's only turn is
# sampled. Rank 0 thus generates two rounds and rank 1 one.
CROP_WORKER = WORKER.replace("from grounding_rl.cli.train import main", '''
import os
from grounding_rl.rollout import conversation as conv
from transformers import AutoTokenizer
real_turns = conv.HFTurns.continue_turn
rounds = []
def rank_scripted(self, trajectories, params):
    tok = AutoTokenizer.from_pretrained(self.model.config._name_or_path)
    crop = tok('<tool_call>{"name": "crop", "arguments": {"start": 1, "end": 3}}</tool_call>',
               add_special_tokens=False)["input_ids"] + [tok.convert_tokens_to_ids("<|im_end|>")]
    rounds.append(len(trajectories))
    sampled = real_turns(self, trajectories, params)
    if os.environ["RANK"] == "0" and not trajectories[0].turns:
        return [crop for _ in trajectories]
    return sampled
conv.HFTurns.continue_turn = rank_scripted
from grounding_rl.cli.train import main''').replace('"global_step": t.state.global_step,',
                                                     '"global_step": t.state.global_step, "rounds": rounds,')


@pytest.mark.slow
def test_two_processes_zero3_multi_turn_ranks_with_different_numbers_of_turns(tmp_path, tiny_model_dir, videos_dir):
    """Multi-turn GRPO (the crop tool) under ZeRO-3 on 2 processes with a sharded reference model: rank 0 runs two
    model turns per trajectory (a crop, then the model's turn over the clip and the window), rank 1 one; neither waits
    for the other inside ``generate``, both finish 2 steps, and the logged tool metrics are those of all 8
    trajectories of a step (reduced over ranks): 1.5 turns and 0.5 calls per trajectory, on both ranks."""
    files, _ = _launch(tmp_path, tiny_model_dir,
                       ["--config_file", str(REPO_ROOT / "configs" / "accelerate" / "zero3.yaml"),
                        "--num_processes", "2"],
                       ["--per_device_train_batch_size", "2", "--num_generations", "2", "--beta", "0.04",
                        "--max_tool_calling_iterations", "1"], timeout=300, worker_source=CROP_WORKER)
    reports = [json.loads(f.read_text()) for f in files]
    assert [r["rank"] for r in reports] == [0, 1]
    assert reports[0]["rounds"] == [2, 2, 2, 2] and reports[1]["rounds"] == [2, 2]  # per step: rounds of 2 rows
    for r in reports:
        assert (r["world_size"], r["zero_stage"], r["global_step"]) == (2, 3, 2) and r["ref_sharded"] > 0
        for log in r["logs"]:
            assert log["turns/mean"] == 1.5 and log["tools/call_frequency"] == 0.5  # (2 + 2 + 1 + 1) / 4 rows
            assert log["tools/failure_frequency"] == 0.0 and math.isfinite(log["loss"])
        assert r["logs"][0]["kl"] == pytest.approx(0.0, abs=1e-6)  # π_θ = π_ref over the same multi-turn inputs
        assert r["logs"][1]["kl"] > 1e-5
    assert reports[0]["logs"] == reports[1]["logs"]


@pytest.mark.slow
def test_two_processes_zero3_dynamic_sampling_stays_in_lockstep(tmp_path, tiny_model_dir, videos_dir):
    """Dynamic sampling under ZeRO-3 on 2 ranks whose groups keep different numbers of groups: every rank draws the
    same number of generation batches (a deadlock would time out), both finish, and the metrics agree."""
    spec = f"{REPO_ROOT / 'tests' / 'conftest.py'}:spread_for_some_clips"
    files, _ = _launch(tmp_path, tiny_model_dir,
                       ["--config_file", str(REPO_ROOT / "configs" / "accelerate" / "zero3.yaml"),
                        "--num_processes", "2"],
                       ["--per_device_train_batch_size", "4", "--num_generations", "2", "--beta", "0.0",
                        "--reward_funcs", spec, "--dynamic_sampling", "true", "--max_num_gen_batches", "3"],
                       timeout=600)
    reports = [json.loads(f.read_text()) for f in files]
    assert [r["rank"] for r in reports] == [0, 1] and all(r["global_step"] == 2 for r in reports)
    logs = reports[0]["logs"]
    assert logs == reports[1]["logs"]
    for log in logs:
        assert 1.0 <= log["dynamic_sampling/gen_batches"] <= 3.0
        assert log["dynamic_sampling/groups_drawn"] == 4.0 * log["dynamic_sampling/gen_batches"]
        assert math.isfinite(log["loss"])
    assert any(log["dynamic_sampling/groups_dropped"] > 0 for log in logs)


@pytest.mark.slow
def test_one_process_lora_uses_adapter_free_base_as_reference(tmp_path, family_model_dir, videos_dir):
    tiny_model_dir = family_model_dir
    files, _ = _launch(tmp_path, tiny_model_dir, ["--num_processes", "1"],
                       ["--beta", "0.04", "--use_peft", "--lora_r", "4", "--lora_alpha", "8",
                        "--lora_target_modules", "q_proj", "v_proj"], timeout=300)
    (report,) = [json.loads(f.read_text()) for f in files]
    assert report["peft"] and report["ref_type"] is None and report["global_step"] == 2
    losses = [h["loss"] for h in report["logs"]]
    assert len(losses) == 2 and all(math.isfinite(x) for x in losses)
    assert report["logs"][0]["kl"] == pytest.approx(0.0, abs=1e-6)
    assert report["logs"][1]["kl"] > 0.0  # the adapter moved; the disabled-adapter base did not
    out = tmp_path / "out"
    assert (out / "adapter_config.json").is_file() and (out / "grounding_config.json").is_file()
    # exported as merged full weights that plain transformers (and eval, infer, any engine) loads
    from safetensors.torch import load_file
    from transformers import AutoModelForImageTextToText

    from grounding_rl.cli import main as cli

    merged = tmp_path / "merged"
    assert cli(["merge-lora", "--adapter", str(out), "--out", str(merged)]) == 0
    assert (merged / "grounding_config.json").is_file() and not (merged / "adapter_config.json").exists()
    weights, base = load_file(str(merged / "model.safetensors")), load_file(str(tiny_model_dir / "model.safetensors"))
    assert not any("lora" in key for key in weights)
    q_key = next(k for k in base if k.endswith("layers.0.self_attn.q_proj.weight"))
    k_key = q_key.replace("q_proj", "k_proj")
    assert not torch.equal(weights[q_key], base[q_key])  # the trained adapter is in the merged weights
    assert torch.equal(weights[k_key], base[k_key])  # modules without an adapter are untouched
    architecture = json.loads((tiny_model_dir / "config.json").read_text())["architectures"]
    assert [type(AutoModelForImageTextToText.from_pretrained(merged)).__name__] == architecture


@pytest.mark.slow
def test_two_processes_zero3_killed_inside_a_save_resumes_bit_identical(tmp_path, tiny_model_dir, videos_dir):
    """ZeRO-3 on 2 processes with a sharded reference model: a 3-step run killed inside checkpoint-3's save, once a
    rank's optimizer shard is written and before the checkpoint's mark (the hook ``GROUNDING_RL_FAULT_AFTER``); the
    same command with ``--resume_from_checkpoint true`` skips checkpoint-3, resumes checkpoint-2 (DeepSpeed's own
    checkpoint, optimizer shards and per-rank RNG states) and ends with the bytes of ``model.safetensors`` that
    checkpoint-3 had: the step-3 weights, written before the kill, which an uninterrupted run ends with."""
    from safetensors.torch import load_file

    from grounding_rl.update.checkpoints import FAULT_ENV, checkpoint_problem

    launcher = ["--config_file", str(REPO_ROOT / "configs" / "accelerate" / "zero3.yaml"), "--num_processes", "2"]
    train = ["--per_device_train_batch_size", "2", "--beta", "0.04", "--max_steps", "3", "--save_strategy", "steps",
             "--save_steps", "1"]
    out = tmp_path / "run"
    _launch(tmp_path, tiny_model_dir, launcher, train, timeout=600, out=out, killed=True,
            env_extra={FAULT_ENV: "checkpoint-3/global_step3/*optim_states.pt"})
    assert checkpoint_problem(out / "checkpoint-2") is None and checkpoint_problem(out / "checkpoint-3") is not None
    assert not (out / "model.safetensors").exists()
    step3 = load_file(str(out / "checkpoint-3" / "model.safetensors"))
    files, proc = _launch(tmp_path, tiny_model_dir, launcher, [*train, "--resume_from_checkpoint", "true"],
                          timeout=600, out=out)
    assert "resume_from_checkpoint: skipped checkpoint-3 (" in proc.stderr
    assert [json.loads(f.read_text())["global_step"] for f in files] == [3, 3]
    final = load_file(str(out / "model.safetensors"))
    assert final.keys() == step3.keys()
    assert [k for k in final if not torch.equal(final[k], step3[k])] == []
    start = load_file(str(out / "checkpoint-2" / "model.safetensors"))
    assert any(not torch.equal(start[k], final[k]) for k in final)  # step 3 moved the weights


SIGNAL_WORKER = """
import os, signal, sys
from grounding_rl.update import preemption

def on_step_begin(self, args, state, control, **kwargs):  # SIGTERM to rank 1 alone as step 2 begins
    if state.global_step + 1 == 2 and os.environ.get("RANK") == "1":
        os.kill(os.getpid(), signal.SIGTERM)
    return control

preemption.PreemptionCallback.on_step_begin = on_step_begin
from grounding_rl.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow
def test_two_processes_zero3_sft_preempted_and_resumed_end_bit_identical(tmp_path, bpe_tiny_model_dir):
    """``grounding-rl sft`` under ZeRO-3 on 2 processes (``save_strategy: no``): 3 steps straight; and SIGTERM to rank 1
    alone during step 2: both ranks finish step 2, save checkpoint-2 (DeepSpeed's shards of both) and stop, rank 0
    printing the one line, the launcher exiting 0; the same command with ``--resume_from_checkpoint auto`` ends with the same bytes in
    ``model.safetensors``."""
    from safetensors.torch import load_file

    from grounding_rl.dev.demo import generate_demo
    from grounding_rl.update.checkpoints import checkpoint_problem

    demo = tmp_path / "demo"
    generate_demo(demo, num_train=8, num_test=1, seed=0, progress=False)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu",
           "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": str(REPO_ROOT)}
    accelerate = Path(sys.executable).parent / "accelerate"
    (tmp_path / "signal_worker.py").write_text(SIGNAL_WORKER)

    def sft(out, *extra, entry=("-m", "grounding_rl.cli")):
        cmd = [str(accelerate), "launch", "--config_file", str(REPO_ROOT / "configs" / "accelerate" / "zero3.yaml"),
               "--num_processes", "2", *entry, "sft", "--config",
               str(REPO_ROOT / "configs" / "demo_sft.yaml"), "--model_name_or_path", str(bpe_tiny_model_dir),
               "--train_file", str(demo / "train.jsonl"), "--output_dir", str(out), "--max_train_samples", "8",
               "--per_device_train_batch_size", "2", "--max_steps", "3", "--warmup_steps", "1",
               "--learning_rate", "3e-3", "--save_strategy", "no", "--disable_tqdm", "true", "--report_to", "none",
               *extra]
        return subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600)

    proc = sft(tmp_path / "full")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    out = tmp_path / "preempted"
    proc = sft(out, entry=(str(tmp_path / "signal_worker.py"),))
    assert proc.returncode == 0 and f"grounding-rl sft: stopped by SIGTERM at step 2 of 3: {out / 'checkpoint-2'} saved" \
        in proc.stderr, proc.stderr[-6000:]  # every rank exits 0 under a launcher
    assert checkpoint_problem(out / "checkpoint-2") is None and not (out / "model.safetensors").exists()
    assert len(list((out / "checkpoint-2").glob("global_step2/*optim_states.pt"))) == 2  # both ranks' shards
    proc = sft(out, "--resume_from_checkpoint", "auto")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    final, again = load_file(str(tmp_path / "full" / "model.safetensors")), load_file(str(out / "model.safetensors"))
    assert final.keys() == again.keys()
    assert [k for k in final if not torch.equal(final[k], again[k])] == []
    start = load_file(str(out / "checkpoint-2" / "model.safetensors"))
    assert any(not torch.equal(start[k], final[k]) for k in final)  # step 3 moved the weights


@pytest.mark.slow
def test_two_processes_zero3_distill_shards_the_teacher(tmp_path, tiny_model_dir, videos_dir):
    """``grounding-rl distill`` under ZeRO-3 on 2 processes: the teacher is DeepSpeed-initialised and partitioned like
    the reference model; teacher = the starting student, so the first step's divergence is 0 and the second's is not
    (the update moved the student); both ranks log the same reduced metrics."""
    worker = WORKER.replace("from grounding_rl.cli.train import main", "from grounding_rl.cli.distill import main")
    worker = worker.replace('"ref_type": type(ref).__name__ if ref is not None else None,',
                            '"ref_type": type(ref).__name__ if ref is not None else None, "teacher_sharded": sum(1 '
                            'for r in t.recipes if r.name == "distillation" for p in r.teacher.parameters() if '
                            'hasattr(p, "ds_id") and p.numel() == 0), "teacher_type": [type(r.teacher).__name__ for '
                            'r in t.recipes if r.name == "distillation"],')
    (tmp_path / "worker.py").write_text(worker)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu",
           "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": str(REPO_ROOT)}
    cmd = [str(Path(sys.executable).parent / "accelerate"), "launch", "--config_file",
           str(REPO_ROOT / "configs" / "accelerate" / "zero3.yaml"), "--num_processes", "2",
           str(tmp_path / "worker.py"), str(tmp_path / "report"),
           "--config", str(REPO_ROOT / "configs" / "tiny_real_clips.yaml"), "--model_name_or_path",
           str(tiny_model_dir), "--teacher_model_name_or_path", str(tiny_model_dir), "--output_dir",
           str(tmp_path / "out"), "--num_generations", "1", "--scale_rewards", "none", "--beta", "1.0",
           "--per_device_train_batch_size", "2", "--learning_rate", "1e-2", "--max_completion_length", "8",
           "--max_steps", "2"]
    proc = subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    reports = [json.loads(f.read_text()) for f in sorted(tmp_path.glob("report.rank*.json"))]
    assert [r["rank"] for r in reports] == [0, 1]
    for r in reports:
        assert (r["world_size"], r["zero_stage"], r["global_step"]) == (2, 3, 2)
        assert r["teacher_type"] == ["DeepSpeedEngine"] and r["teacher_sharded"] > 0 and r["ref_type"] is None
        assert r["logs"][0]["distillation/divergence"] == pytest.approx(0.0, abs=1e-6)
        assert r["logs"][1]["distillation/divergence"] > 1e-6
    assert reports[0]["logs"] == reports[1]["logs"]
    assert "| teacher |" in (tmp_path / "out" / "README.md").read_text()


# Attempt 0 (TORCHELASTIC_RESTART_COUNT=0): the fault hook hangs rank 1 (SIGSTOP: its connections stay open) inside
# checkpoint-2's save, once its RNG state is written, after it sent SIGTERM to rank 0 (a preemption that reaches a rank
# whose peer is gone); 21 s later a watcher in its own session kills it (the launcher's SIGTERM stops at the stopped
# process and its SIGKILL comes 30 s later; a watcher in the rank's session would die with that SIGTERM). Attempt 1: rank 0 first keeps
# the step-2 weights attempt 0 wrote before the hang; rank 1 is SIGKILLed right after sampling step 2's completions.
# Attempt 2 runs undisturbed.
RESTART_WORKER = """
import os, shutil, signal, subprocess, sys
from pathlib import Path
from grounding_rl.update import checkpoints

report, attempt, rank = Path(sys.argv[1]), os.environ["TORCHELASTIC_RESTART_COUNT"], os.environ["RANK"]
if attempt == "0":
    if rank == "0":
        report.with_suffix(".pid0").write_text(str(os.getpid()))
    def hang():
        if rank == "1":
            os.kill(int(report.with_suffix(".pid0").read_text()), signal.SIGTERM)
            subprocess.Popen(["sh", "-c", f"sleep 21; kill -9 {os.getpid()}"], start_new_session=True)
            os.kill(os.getpid(), signal.SIGSTOP)
    checkpoints._die = hang
else:
    del os.environ[checkpoints.FAULT_ENV]
    if rank == "0" and attempt == "1":
        shutil.copy(Path(sys.argv[2]) / "checkpoint-2" / "model.safetensors", report.with_suffix(".step2"))
if attempt == "1" and rank == "1":
    from grounding_rl.rollout.generation import HFGenerateEngine
    sample = HFGenerateEngine.generate
    def generate_then_die(self, *args, **kwargs):
        sample(self, *args, **kwargs)
        os.kill(os.getpid(), signal.SIGKILL)
    HFGenerateEngine.generate = generate_then_die
from grounding_rl.cli import main
sys.exit(main(sys.argv[3:]))
"""


@pytest.mark.slow
def test_two_processes_dead_or_hung_rank_ends_the_run_and_restarts_resume_bit_identical(tmp_path, tiny_model_dir,
                                                                                          videos_dir):
    """DDP on 2 CPU processes (gloo) under ``accelerate launch --max_restarts 2 --rdzv_backend c10d`` with
    ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` (the static rendezvous, and c10d's store shared with the workers, keep
    the first attempt's keys: a restarted rank then dialled the dead rank 0's address in 2 of 3 tries, pytorch#135712),
    ``--resume_from_checkpoint auto``, ``ddp_timeout: 15``. Attempt 0: rank 1 hangs (SIGSTOP) inside checkpoint-2's
    save and rank 0 gets SIGTERM meanwhile; rank 0 fails its barrier after the timeout and exits with one line naming
    rank 1 and the signal, without a save; checkpoint-2 never gets its mark. Attempt 1 (the same command) resumes
    checkpoint-1; rank 1 is SIGKILLed in step 2's generation and rank 0 exits with one line naming it. Attempt 2
    resumes checkpoint-1 again and ends with the bytes of the step-2 weights attempt 0 computed before the hang (what
    an uninterrupted run ends with)."""
    from safetensors.torch import load_file

    from grounding_rl.update.checkpoints import FAULT_ENV

    out = tmp_path / "run"
    (tmp_path / "worker.py").write_text(RESTART_WORKER)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
           "PYTHONPATH": str(REPO_ROOT), FAULT_ENV: "checkpoint-2/rng_state_1.pth",
           "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}  # else a restarted rank may read the dead one's address
    cmd = [str(Path(sys.executable).parent / "accelerate"), "launch", "--config_file",
           str(REPO_ROOT / "configs" / "accelerate" / "ddp.yaml"), "--num_processes", "2", "--max_restarts", "2",
           "--rdzv_backend", "c10d", "--monitor_interval", "1", str(tmp_path / "worker.py"), str(tmp_path / "report"),
           str(out), "train", "--config", str(REPO_ROOT / "configs" / "tiny_real_clips.yaml"),
           "--model_name_or_path", str(tiny_model_dir), "--output_dir", str(out), "--reward_funcs", REWARD_SPEC,
           "--reward_weights", "1.0", "--learning_rate", "1e-3", "--max_completion_length", "8",
           "--per_device_train_batch_size", "2", "--max_steps", "2", "--save_strategy", "steps", "--save_steps", "1",
           "--ddp_timeout", "15", "--resume_from_checkpoint", "auto"]
    proc = subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    lost = [line for line in proc.stderr.splitlines() if "grounding-rl train: error:" in line]
    assert len(lost) == 2, proc.stderr[-6000:]
    assert "rank 1 of 2 lost (it stopped answering for ddp_timeout=15 s" in lost[0] \
        and "SIGTERM received: exiting without a save" in lost[0], lost
    assert "rank 1 of 2 lost (it died: its connection closed" in lost[1], lost
    assert proc.stderr.count("resume_from_checkpoint: skipped checkpoint-2 (") == 2  # the hung save has no mark
    step2 = load_file(str(tmp_path / "report.step2"))
    final = load_file(str(out / "model.safetensors"))
    assert final.keys() == step2.keys() and [k for k in final if not torch.equal(final[k], step2[k])] == []
    start = load_file(str(out / "checkpoint-1" / "model.safetensors"))
    assert any(not torch.equal(start[k], final[k]) for k in final)  # step 2 moved the weights


@pytest.mark.parametrize("message, rank, line", [
    ("[gloo/transport/tcp/pair.cc:545] Read error [127.0.0.1]:22709: Connection reset by peer. This is typically "
     "caused by a remote worker hanging", 0, "rank 1 of 2 lost (it died: its connection closed: Connection reset by "
                                             "peer)"),
    ("[gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 5000ms for recv operation to complete", 1,
     "rank 0 of 2 lost (it stopped answering for ddp_timeout=5 s: Timed out waiting)"),
    ("CUDA out of memory", 0, None),
    ("[Errno 32] Broken pipe", 0, None),  # not from a collective
])
def test_peer_lost_names_the_rank_from_gloos_messages(message, rank, line):
    """The messages gloo raised on this machine (torch 2.14) when the other of 2 ranks was SIGKILLed / SIGSTOPped
    with a 5 s timeout; any other error is not a lost peer."""
    from grounding_rl.cli.common import peer_lost

    assert peer_lost(RuntimeError(message), rank, 2, 5) == line
    assert peer_lost(RuntimeError(message), rank, 1, 5) is None
    if line:
        assert peer_lost(RuntimeError(message), 3, 8, 5).startswith("a peer of rank 3 (of 8) lost (")


# One process per "machine": records the ranks it ran as and every file it opened for writing from Python (JSON, the
# model card, the tokenizer, the checkpoint's mark; not torch's or safetensors' own writers); with STOP_AFTER_STEP_1,
# machine 1 gets SIGTERM as step 1 begins (a preemption: both stop after step 1 with checkpoint-1 saved).
MACHINE_WORKER = """
import json, os, signal, sys
import torch
torch.set_num_threads(1)
written = set()
def audit(event, args):
    if event != "open":
        return
    path, mode, flags = args
    if isinstance(path, str) and (
            mode is None and flags & (os.O_WRONLY | os.O_RDWR) or isinstance(mode, str) and set(mode) & set("wax+")):
        written.add(os.path.abspath(path))
sys.addaudithook(audit)
if os.environ.get("STOP_AFTER_STEP_1") and os.environ["RANK"] == "1":
    from grounding_rl.update import preemption
    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step == 0:
            os.kill(os.getpid(), signal.SIGTERM)
        return control
    preemption.PreemptionCallback.on_step_begin = on_step_begin
from importlib import import_module
rc = import_module("grounding_rl.cli." + sys.argv[2]).main(sys.argv[3:])
from accelerate import PartialState
state = PartialState()
report = {"rc": rc, "rank": state.process_index, "world_size": state.num_processes, "written": sorted(written)}
with open(f"{sys.argv[1]}.rank{state.process_index}.json", "w") as f:
    json.dump(report, f)
"""


def _two_machines(tmp_path, name, per_machine, env_extra=()):
    """``accelerate launch`` of :data:`MACHINE_WORKER` as machine 0 and machine 1 of 2 on 127.0.0.1 (the DDP config,
    one process each, a free port), ``per_machine[r]`` its arguments; both must exit 0. Returns the two reports."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    worker = tmp_path / "machine_worker.py"
    worker.write_text(MACHINE_WORKER)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
           "PYTHONPATH": str(REPO_ROOT), **dict(env_extra)}
    launch = [str(Path(sys.executable).parent / "accelerate"), "launch", "--config_file",
              str(REPO_ROOT / "configs" / "accelerate" / "ddp.yaml"), "--num_machines", "2", "--num_processes", "2",
              "--main_process_ip", "127.0.0.1", "--main_process_port", str(port)]
    logs = [tmp_path / f"{name}.machine{rank}.log" for rank in (0, 1)]
    procs = []
    for rank, (args, log) in enumerate(zip(per_machine, logs)):
        with log.open("w") as handle:  # a session each: ended with its workers below if need be
            procs.append(subprocess.Popen([*launch, "--machine_rank", str(rank), str(worker), str(tmp_path / name),
                                           *args], cwd=REPO_ROOT, env=env, stdout=handle, stderr=subprocess.STDOUT,
                                          start_new_session=True))
    deadline = time.monotonic() + 300
    # a machine that failed leaves the other waiting for it (the rendezvous, a collective): end both then
    while any(p.poll() is None for p in procs) and time.monotonic() < deadline and \
            not any(p.returncode for p in procs):
        time.sleep(0.5)
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert [proc.returncode for proc in procs] == [0, 0], "".join(log.read_text()[-4000:] for log in logs)
    reports = [json.loads((tmp_path / f"{name}.rank{rank}.json").read_text()) for rank in (0, 1)]
    # world size 2 on both: `--cpu --num_machines 2` would run each machine alone as rank 0 of 1
    assert [(r["rank"], r["world_size"], r["rc"]) for r in reports] == [(0, 2, 0), (1, 2, 0)]
    return reports


@pytest.mark.slow
def test_two_machines_on_one_host_train_resume_and_eval_as_one_machine(tmp_path, tiny_model_dir, videos_dir):
    """Two "machines" on one host (``--num_machines 2 --machine_rank {0,1} --main_process_ip 127.0.0.1``, the DDP
    config, ``use_cpu: true``, one process each). (a) One shared ``output_dir``, 2 steps: rank 1 writes no file there
    from Python (only its ``rng_state_1.pth``), every run file is there once. (b) Each machine its own ``output_dir``
    with ``save_on_each_node: true``: preempted on machine 1 after step 1, then the same command resumes on both from
    their own checkpoint-1 (each folder a complete checkpoint with the weights, rank 1's holding only its own RNG
    state and none of the global main's files) and ends with the bytes of (a); then a sharded ``eval`` of each
    machine's own folder into one shared folder, resuming an eval cut short, gives the predictions and metrics of a
    one-process eval."""
    from safetensors.torch import load_file

    from grounding_rl.cli.eval import main as evaluate
    from grounding_rl.update.checkpoints import checkpoint_problem

    train = ["train", "--config", str(REPO_ROOT / "configs" / "tiny_real_clips.yaml"), "--model_name_or_path",
             str(tiny_model_dir), "--reward_funcs", REWARD_SPEC, "--reward_weights", "1.0", "--learning_rate", "1e-3",
             "--max_completion_length", "8", "--per_device_train_batch_size", "2", "--max_steps", "2",
             "--save_strategy", "steps", "--save_steps", "1", "--resume_from_checkpoint", "auto"]
    shared = tmp_path / "shared"
    reports = _two_machines(tmp_path, "a", [[*train, "--output_dir", str(shared)]] * 2)
    assert [p for p in reports[1]["written"] if p.startswith(str(shared))] == []
    assert {"model.safetensors", "trainer_state.json", "train_results.json"} <= {p.name for p in shared.iterdir()}
    for step in (1, 2):
        assert checkpoint_problem(shared / f"checkpoint-{step}") is None
        assert sorted(p.name for p in (shared / f"checkpoint-{step}").glob("rng_state*")) == \
            ["rng_state_0.pth", "rng_state_1.pth"]
    weights = load_file(str(shared / "model.safetensors"))

    nodes = [tmp_path / "node0", tmp_path / "node1"]
    per_node = [[*train, "--output_dir", str(node), "--save_on_each_node", "true"] for node in nodes]
    _two_machines(tmp_path, "b1", per_node, env_extra={"STOP_AFTER_STEP_1": "1"})
    for node in nodes:
        assert checkpoint_problem(node / "checkpoint-1") is None and not (node / "checkpoint-2").exists()
        assert not (node / "model.safetensors").exists()  # stopped, not finished
    reports = _two_machines(tmp_path, "b2", per_node)
    assert [p for p in reports[1]["written"] if p.startswith(str(nodes[0]))] == []
    assert any(p.startswith(str(nodes[1] / "checkpoint-2")) for p in reports[1]["written"])
    for rank, node in enumerate(nodes):
        final = load_file(str(node / "model.safetensors"))
        assert final.keys() == weights.keys() and [k for k in final if not torch.equal(final[k], weights[k])] == []
        for step in (1, 2):
            folder = node / f"checkpoint-{step}"
            assert checkpoint_problem(folder) is None and (folder / "model.safetensors").is_file()
            assert [p.name for p in folder.glob("rng_state*")] == [f"rng_state_{rank}.pth"]
    global_main_only = {"trainer_state.json", "train_results.json", "all_results.json"}
    assert global_main_only <= {p.name for p in nodes[0].iterdir()}
    assert global_main_only.isdisjoint(p.name for p in nodes[1].iterdir())

    lines = (videos_dir / "annotations.jsonl").read_text().splitlines()
    data = tmp_path / "test.jsonl"  # three clips: the first done before, then one per rank
    rows = [json.loads(lines[i]) for i in (5, 14, 13)]
    data.write_text("".join(json.dumps({**row, "video": str(videos_dir / row["video"])}) + "\n" for row in rows))
    eval_args = ["--data", str(data), "--max-new-tokens", "8"]
    # an eval of machine 0's copy cut short after one query; the sharded rerun resumes it, each machine reading its
    # own copy (rank 1 judges the record by the main process's model: its own copy's path and fingerprint differ)
    assert evaluate(["--model", str(nodes[0]), "--out", str(tmp_path / "eval2"), "--limit", "1", *eval_args]) == 0
    reports = _two_machines(tmp_path, "e", [["eval", "--model", str(node), "--out", str(tmp_path / "eval2"),
                                             *eval_args] for node in nodes])
    assert [p for p in reports[1]["written"] if "eval2" in p] == [str(tmp_path / "eval2" / "predictions.rank1.jsonl")]
    assert evaluate(["--model", str(shared), "--out", str(tmp_path / "eval1"), *eval_args]) == 0
    one, two = ((tmp_path / name / "predictions.jsonl").read_text() for name in ("eval1", "eval2"))
    assert len(one.splitlines()) == 3 and one == two
    metrics = [json.loads((tmp_path / name / "metrics.json").read_text()) for name in ("eval1", "eval2")]
    assert metrics[0]["num_processes"] == 1 and metrics[1]["num_processes"] == 2
    for m in metrics:  # what differs by design: the folder read, the process count, the clock
        for key in ("num_processes", "run", "model", "created"):
            m.pop(key)
        m["sampling"].pop("source")
    assert metrics[0] == metrics[1]


def test_ranks_that_found_different_checkpoints_are_refused():
    """Per-node output folders without ``save_on_each_node``: node 1's folder holds no complete checkpoint (only
    its RNG state), so its rank would start from step 0 beside a resumed rank 0; refused naming each rank's find."""
    from grounding_rl.cli.common import same_checkpoint_on_every_rank
    from grounding_rl.errors import UserError

    same_checkpoint_on_every_rank(["checkpoint-2", "checkpoint-2"], "out")
    same_checkpoint_on_every_rank([None, None], "out")
    with pytest.raises(UserError, match=r"in out \(rank 0: checkpoint-2, rank 1: none\); .*save_on_each_node: true"):
        same_checkpoint_on_every_rank(["checkpoint-2", None], "out")


def test_each_nodes_saving_process_writes_the_weights(tmp_path, tiny_model_dir, monkeypatch):
    """``save_on_each_node``: node 1's first process (rank 1, ``should_save``) gets the weights and ``config.json`` in
    its checkpoint; transformers (5.24) writes them on ``torch.distributed`` rank 0 alone, whatever
    ``is_main_process`` says (were it to stop, the first assert fails and the override can go)."""
    from types import SimpleNamespace

    from transformers import AutoModelForImageTextToText
    from transformers.distributed import mixin

    from grounding_rl.update.checkpoints import CompleteCheckpointMixin

    monkeypatch.setattr(mixin, "_is_torch_distributed_initialized", lambda: True)
    monkeypatch.setattr(mixin, "_get_torch_distributed_rank", lambda: 1)
    model = AutoModelForImageTextToText.from_pretrained(tiny_model_dir)
    model.save_pretrained(tmp_path / "plain", is_main_process=True)
    assert not (tmp_path / "plain" / "model.safetensors").exists()  # transformers' own rule

    class Trainer:  # transformers.Trainer._save's call, as a rank that should_save
        def save_model(self, output_dir, _internal_call=False):
            self.model.save_pretrained(output_dir, is_main_process=self.args.should_save)

    class Saving(CompleteCheckpointMixin, Trainer):
        pass

    trainer = Saving()
    trainer.model, trainer.accelerator = model, SimpleNamespace(unwrap_model=lambda m: m)
    trainer.args = SimpleNamespace(should_save=True, process_index=1, output_dir=str(tmp_path / "node1"))
    trainer.save_model(str(tmp_path / "node1"))
    assert {"model.safetensors", "config.json"} <= {p.name for p in (tmp_path / "node1").iterdir()}


def test_a_folder_two_nodes_share_is_seen_by_their_probes(tmp_path):
    """``save_on_each_node``: a saving process sees another rank's probe of the same launch in its folder (a shared
    folder), not its own nor an earlier launch's."""
    from grounding_rl.cli.common import PROBE, probing_ranks

    for name in (f"{PROBE}.abc.0", f"{PROBE}.abc.8", f"{PROBE}.old.4"):
        (tmp_path / name).touch()
    assert probing_ranks(tmp_path, "abc", 0) == [8] and probing_ranks(tmp_path, "abc", 8) == [0]
    assert probing_ranks(tmp_path, "new", 0) == []
