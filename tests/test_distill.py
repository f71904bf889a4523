"""On-policy distillation (``grounding-rl distill`` and the GRPO teacher term) on tiny models and the demo clips."""
import json

import pytest
import torch

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory):
    from grounding_rl.dev.demo import generate_demo

    out = tmp_path_factory.mktemp("demo")
    generate_demo(out, num_train=4, num_test=2, seed=0, progress=False)
    return out


def distill_argv(demo_dir, student, teacher, out, *extra):
    """A ``grounding-rl distill`` run from flags alone (no --config)."""
    return ["distill", "--model_name_or_path", str(student), "--teacher_model_name_or_path", str(teacher),
            "--train_file", str(demo_dir / "train.jsonl"), "--video_root", str(demo_dir), "--output_dir", str(out),
            "--use_cpu", "true", "--dtype", "float32", "--per_device_train_batch_size", "2", "--max_steps", "2",
            "--max_completion_length", "8", "--logging_steps", "1", "--save_strategy", "no", "--report_to", "none",
            "--disable_tqdm", "true", "--dataloader_num_workers", "0", "--video_fps", "1", "--video_min_pixels",
            "3136", "--video_max_pixels", "3136", "--seed", "0", *extra]


def test_distill_from_itself_has_zero_loss_and_leaves_trains_files(tmp_path, demo_dir, bpe_tiny_model_dir):
    """Teacher = student: the loss and the divergence are 0 at every step (no dropout, no weight decay by default);
    the folder holds what train leaves, with save_strategy no, and the model card names the teacher."""
    from grounding_rl.cli import main as cli

    out = tmp_path / "run"
    assert cli(distill_argv(demo_dir, bpe_tiny_model_dir, bpe_tiny_model_dir, out)) == 0
    logs = [entry for entry in json.loads((out / "trainer_state.json").read_text())["log_history"] if "loss" in entry]
    assert [entry["step"] for entry in logs] == [1, 2]
    assert all(abs(entry["loss"]) < 1e-6 and abs(entry["distillation/divergence"]) < 1e-6 for entry in logs), logs
    assert "train_loss" in json.loads((out / "train_results.json").read_text())
    assert json.loads((out / "grounding_config.json").read_text())["prompt_template"] == "default"
    card = (out / "README.md").read_text()
    assert f"| teacher | `{bpe_tiny_model_dir}` |" in card and "(distillation, grounding_rl)" in card


def test_cross_family_pair_is_refused_unless_thinking_free(tmp_path, demo_dir, tiny_model_dir, tiny_qwen3_model_dir,
                                                           capsys):
    """A Qwen3-VL teacher for a Qwen2.5-VL student: refused in one line with a thinking template (Qwen3 defines
    <think> as one token); trained with default_no_think, the teacher seeing the same frames at its own pixel factor
    (32, the student's 28) and the divergence running over the 151,665 ids both tokenizers define."""
    from grounding_rl.cli import main as cli

    argv = distill_argv(demo_dir, tiny_model_dir, tiny_qwen3_model_dir, tmp_path / "refused")
    assert cli(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "<think>" in err and "default_no_think" in err, err
    out = tmp_path / "run"
    assert cli(distill_argv(demo_dir, tiny_model_dir, tiny_qwen3_model_dir, out, "--prompt_template",
                            "default_no_think", "--beta", "0.5")) == 0
    logs = [entry for entry in json.loads((out / "trainer_state.json").read_text())["log_history"] if "loss" in entry]
    assert all(entry["distillation/divergence"] > 0 for entry in logs), logs


def test_shared_vocabulary_of_the_real_tokenizers(qwen_processor_dir, qwen3_processor_dir):
    """Qwen3-VL adds four ids (151,665-151,668) to Qwen2.5-VL's 151,665, left out of the divergence; the rest agree."""
    from transformers import AutoTokenizer

    from grounding_rl.update import divergence

    q7, qwen3 = AutoTokenizer.from_pretrained(qwen_processor_dir), AutoTokenizer.from_pretrained(qwen3_processor_dir)
    assert (len(q7), len(qwen3)) == (151665, 151669)
    assert divergence.shared_vocab_size(q7, qwen3) == 151665
    assert divergence.tokenizer_mismatch(q7, qwen3, thinking_free=True) is None


@pytest.fixture(scope="module")
def noisy_bpe_teacher(bpe_tiny_model_dir, tmp_path_factory):
    """The demo's tiny model with re-drawn weights: a teacher that disagrees with the student."""
    from conftest import make_noisy_model

    return make_noisy_model(bpe_tiny_model_dir, tmp_path_factory.mktemp("noisy_bpe"))


def test_lora_student_resumes_bit_exact_and_no_checkpoint_holds_the_teacher(tmp_path, demo_dir, bpe_tiny_model_dir,
                                                                            noisy_bpe_teacher):
    """A LoRA student distilled for 3 steps, and the same run killed after checkpoint-1 and resumed: the same adapter
    bytes. Every checkpoint holds the student's adapter alone (no teacher tensor, no second model file)."""
    import shutil

    from safetensors.torch import load_file

    from grounding_rl.cli import main as cli

    def run(out, *extra):
        return cli(distill_argv(demo_dir, bpe_tiny_model_dir, noisy_bpe_teacher, out, "--use_peft", "true",
                                "--lora_r", "4", "--lora_alpha", "8", "--learning_rate", "1e-2", "--max_steps", "3",
                                "--save_strategy", "steps", "--save_steps", "1", *extra))

    assert run(tmp_path / "full") == 0
    killed = tmp_path / "killed"
    killed.mkdir()
    shutil.copytree(tmp_path / "full" / "checkpoint-1", killed / "checkpoint-1")
    assert run(killed, "--resume_from_checkpoint", "true") == 0
    final, again = (load_file(str(folder / "adapter_model.safetensors")) for folder in (tmp_path / "full", killed))
    assert final.keys() == again.keys() and all(torch.equal(final[k], again[k]) for k in final)
    first = load_file(str(tmp_path / "full" / "checkpoint-1" / "adapter_model.safetensors"))
    assert any(not torch.equal(first[k], final[k]) for k in final)  # it trained
    for folder in [tmp_path / "full", *sorted((tmp_path / "full").glob("checkpoint-*"))]:
        assert all("lora_" in key for key in load_file(str(folder / "adapter_model.safetensors")))
        assert not list(folder.glob("model*.safetensors")), folder
    logs = [e for e in json.loads((tmp_path / "full" / "trainer_state.json").read_text())["log_history"] if "loss" in e]
    assert all(e["distillation/divergence"] > 0 for e in logs)


def test_grpo_with_a_teacher_term_adds_weight_times_the_divergence(tmp_path, videos_dir, bpe_tiny_model_dir,
                                                                   noisy_bpe_teacher):
    """GRPO + teacher (distillation_weight w, distillation_beta 0.5): the micro-batch loss minus the GRPO loss alone is
    w × the logged token-mean divergence (dapo over one process and one micro-batch: the same normaliser); GRPO's beta
    stays the reference KL's (0 here: no reference model)."""
    from conftest import POOL, varied_reward

    from grounding_rl.data.dataset import GroundingDataset
    from grounding_rl.models.loading import load_policy, load_processor
    from grounding_rl.update.config import GroundingGRPOConfig
    from grounding_rl.update.trainer import GroundingGRPOTrainer

    args = GroundingGRPOConfig.build(
        output_dir=str(tmp_path / "out"), use_cpu=True, per_device_train_batch_size=4, max_steps=1,
        max_completion_length=8, report_to=[], save_strategy="no", seed=0, video_fps=1.0, video_min_pixels=3136,
        video_max_pixels=3136, dataloader_num_workers=0, teacher_model_name_or_path=str(noisy_bpe_teacher),
        distillation_weight=0.25, distillation_beta=0.5)
    dataset = GroundingDataset([{"video": str(videos_dir / POOL), "query": "someone cleans the pool", "start": 1.0,
                                 "end": 4.0, "duration": 10.0, "qid": "q"}])
    trainer = GroundingGRPOTrainer(load_policy(str(bpe_tiny_model_dir)), args, dataset,
                                   load_processor(str(bpe_tiny_model_dir)), reward_funcs=[varied_reward])
    assert trainer.ref_model is None and "distillation" in [r.name for r in trainer.recipes]
    batch = trainer.generate_and_score(next(iter(trainer.get_train_dataloader())))
    with_teacher = trainer.compute_loss(trainer.model, batch).item()
    divergence = trainer._metrics["distillation/divergence"][-1]
    args.recipe_args["distillation"].distillation_weight = 0.0  # the same batch, the teacher term weighted 0
    alone = trainer.compute_loss(trainer.model, batch).item()
    assert divergence > 0
    assert with_teacher - alone == pytest.approx(0.25 * divergence, rel=1e-5, abs=1e-7)


def test_fits_counts_the_teacher(capsys):
    """``grounding-rl fits`` on the 7B → 3B recipe: the 7B teacher's bf16 weights, partitioned over 8 GPUs under
    ZeRO-3 and whole under ZeRO-2 (trl.models.prepare_deepspeed keeps a stage-0 copy), and no reference model."""
    from grounding_rl.cli import main as cli

    assert cli(["fits", "configs/qwen2_5_vl_7b_to_3b_distill.yaml", "--gpus", "8", "--json"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])  # after DeepSpeed's own warning
    teacher = report["workload"]["teacher_params"]
    assert 8.2e9 < teacher < 8.4e9 and report["workload"]["num_generations"] == 1
    rows = {row["name"]: row["bytes"] for row in report["strategies"]}
    assert rows["zero3"]["teacher"] == 2 * teacher // 8 and rows["zero2"]["teacher"] == 2 * teacher
    assert rows["zero3"]["reference"] == 0
    b = rows["zero3"]
    assert b["total"] == b["model_states"] + b["teacher"] + b["activations"] + b["overhead"]
    assert report["teacher"]["beta"] == 1.0 and report["workload"]["beta"] == 0.0  # the recipe's beta: 1.0
    assert cli(["fits", "configs/qwen2_5_vl_7b_to_3b_distill.yaml", "--gpus", "8", "--accelerate-config",
                "configs/accelerate/zero3.yaml"]) == 0
    assert "bf16, KL beta 0.0, teacher 8.29e9 parameters (divergence beta 1.0)," in capsys.readouterr().out


@pytest.mark.parametrize("name, student, teacher, template", [
    ("qwen2_5_vl_7b_to_3b_distill.yaml", "Qwen/Qwen2.5-VL-3B-Instruct", "Qwen/Qwen2.5-VL-7B-Instruct", "timezero"),
    ("qwen3_vl_8b_to_2b_distill.yaml", "Qwen/Qwen3-VL-2B-Instruct", "Qwen/Qwen3-VL-8B-Instruct", "timelens"),
])
def test_distill_recipes_parse(name, student, teacher, template):
    """The distillation recipes parse through distill's parser: reverse KL, one completion per clip, no reference KL;
    the Qwen3 pair is thinking-free."""
    from grounding_rl.cli.common import parse_training_args
    from grounding_rl.prompts.templates import is_thinking_free
    from grounding_rl.update import recipes
    from grounding_rl.update.distill_config import DistillationConfig

    _, args, model_args = parse_training_args(DistillationConfig, ["--config", f"configs/{name}", "--use_cpu", "true"],
                                              "grounding-rl distill")
    assert (model_args.model_name_or_path, recipes.teacher(args)) == (student, (teacher, "beta", 1.0))
    assert (args.beta, args.num_generations) == (1.0, 1)
    assert args.prompt_template == template and args.bf16 and args.recipe_args["distillation"].loss_top_k == 0
    assert is_thinking_free(template) == name.startswith("qwen3")


def test_truncated_completions_are_masked_as_in_grpo(tmp_path, demo_dir, bpe_tiny_model_dir, noisy_bpe_teacher):
    """mask_truncated_completions: the random tiny student never ends within 8 tokens, so every completion is
    truncated and masked: the teacher disagrees, yet the loss and the logged divergence are 0."""
    from grounding_rl.cli import main as cli

    out = tmp_path / "run"
    assert cli(distill_argv(demo_dir, bpe_tiny_model_dir, noisy_bpe_teacher, out,
                            "--mask_truncated_completions", "true")) == 0
    logs = [entry for entry in json.loads((out / "trainer_state.json").read_text())["log_history"] if "loss" in entry]
    assert all(e["completions/clipped_ratio"] == 1.0 for e in logs), logs
    assert all(e["loss"] == 0.0 and e["distillation/divergence"] == 0.0 for e in logs), logs


@pytest.mark.parametrize("extra, message", [
    (["--epsilon", "0.3"], "epsilon 0.3 is refused by distill"),
    (["--num_generations", "4"], "num_generations must be 1"),
    (["--distillation_beta", "0.5"], "distill's divergence is beta"),
    (["--beta", "1.5"], "beta must be in [0, 1]"),
    (["--loss_top_k", "1", "--beta", "0.5"], "loss_top_k 1 is TRL's top-1 reverse KL and needs beta 1"),
])
def test_distill_refuses_grpo_only_settings_in_one_line(tmp_path, extra, message, capsys):
    """GRPO-only keys, several completions per prompt, β outside [0, 1]: one line, exit 2, before any model loads."""
    from grounding_rl.cli import main as cli

    argv = ["distill", "--model_name_or_path", str(tmp_path / "student"), "--teacher_model_name_or_path",
            str(tmp_path / "teacher"), "--train_file", str(tmp_path / "train.jsonl"), "--output_dir",
            str(tmp_path / "out"), "--use_cpu", "true", "--report_to", "none", *extra]
    assert cli(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err, err


def test_beta_keeps_trls_name_in_each_command_and_its_help_names_the_other_meaning():
    """train's beta is GRPOConfig's KL weight, distill's DistillationConfig's divergence: each help says so."""
    from dataclasses import fields

    from grounding_rl.update.config import GroundingGRPOConfig
    from grounding_rl.update.distill_config import DistillationConfig

    def help_of(cls):
        return {f.name: f for f in fields(cls)}["beta"].metadata["help"]

    assert "the KL weight; distill's beta is TRL DistillationConfig's divergence" in help_of(GroundingGRPOConfig)
    assert "Unlike GRPO's `beta` (a KL-penalty coefficient" in help_of(DistillationConfig)  # TRL's own text
