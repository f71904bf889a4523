"""Same answers: every answering mode (one pass, ``--zoom``, the crop tool) of ``eval`` and
``infer`` on the noisy tiny model of each family (HF engine) writes, in every field, what the golden files recorded
at the commit before the answering code was unified; the two recipes that run the turn loop (two-pass zoom, crop
tool) end two CPU steps with the recorded weights. The goldens and these checks share tests/golden_answers.py (run it
as a script to rewrite the goldens)."""
import json

import pytest

import golden_answers as golden


@pytest.fixture(scope="module")
def golden_models(noisy_tiny_model_dir, tiny_qwen3_model_dir, tmp_path_factory):
    """The noisy tiny model of each family as ``golden.build_models`` builds it, from the session's tiny models (built
    once for every test file that uses them)."""
    from conftest import make_noisy_model

    return {"qwen2_5_vl": noisy_tiny_model_dir,
            "qwen3_vl": make_noisy_model(tiny_qwen3_model_dir, tmp_path_factory.mktemp("golden") / "noisy_qwen3_vl")}


@pytest.fixture(scope="module", autouse=True)
def lighter_eval():
    with golden.lighter_eval():
        yield


def _read(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize("mode", sorted(golden.MODES))
@pytest.mark.parametrize("family", golden.FAMILIES)
def test_eval_and_infer_answers_match_the_golden_files(golden_models, videos_dir, tmp_path, family, mode):
    model = golden_models[family]
    assert golden.eval_answers(model, videos_dir, mode, tmp_path) == _read(golden.golden_name("eval", family, mode))
    assert golden.infer_answers(model, videos_dir, mode) == _read(golden.golden_name("infer", family, mode))


@pytest.mark.parametrize("recipe", sorted(golden.RECIPES))
@pytest.mark.parametrize("family", golden.FAMILIES)
def test_turn_loop_recipes_end_with_the_golden_weights(golden_models, videos_dir, tmp_path, family, recipe):
    expected = json.loads((golden.GOLDEN / "recipe_weights.json").read_text())[f"{family}/{recipe}"]
    assert golden.recipe_weights_sha256(golden_models[family], videos_dir, recipe, tmp_path) == expected


@pytest.fixture(scope="module")
def scripted_models(tiny_model_dir, tiny_qwen3_model_dir, tmp_path_factory):
    """The scripted model of each family × script (``golden.build_scripted_models``) from the session's tiny models."""
    return golden.build_scripted_models({"qwen2_5_vl": tiny_model_dir, "qwen3_vl": tiny_qwen3_model_dir},
                                        tmp_path_factory.mktemp("scripted"))


@pytest.mark.parametrize("mode", sorted(golden.MODES))
@pytest.mark.parametrize("family", golden.FAMILIES)
def test_scripted_answers_match_the_golden_files(scripted_models, videos_dir, tmp_path, family, mode):
    """Answers that parse: the span, the zoom's window and pass-2 time (Qwen2.5-VL's shifted by the window's first
    frame), the crop tool's calls and windows, as at the reference commit."""
    model = scripted_models[family, golden.SCRIPT_OF_MODE[mode]]
    assert golden.eval_answers(model, videos_dir, mode, tmp_path) == _read(
        golden.golden_name("scripted_eval", family, mode))
    assert golden.infer_answers(model, videos_dir, mode) == _read(golden.golden_name("scripted_infer", family, mode))
