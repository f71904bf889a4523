"""The README's demo tables are a run's output: each equals, to the character, ``grounding-rl compare``'s table of the
entry of ``docs/demo_results.json`` that its marker names (written by ``scripts/demo.sh``), and that entry ran under
the committed lock."""
import hashlib
import json
import re

import pytest

from grounding_rl.dev.demo_results import read_results, record, row_of
from grounding_rl.eval.compare import comparison_table
from grounding_rl.paths import REPO_ROOT

RESULTS = REPO_ROOT / "docs" / "demo_results.json"
MARKER = re.compile(r"<!-- demo_results: (\w+) seed (\d+) -->\n((?:\|.*\|\n)+)")
TABLE_HEAD = "| run | R1@0.3 | R1@0.5 | R1@0.7 | mIoU | format_rate | length_ratio | n |"


def _readme_tables() -> list[tuple[str, int, str]]:
    text = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    return [(family, int(seed), table) for family, seed, table in MARKER.findall(text)]


def test_every_demo_table_in_the_readme_is_an_entry_of_the_results_file():
    text = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    tables = _readme_tables()
    assert text.count(TABLE_HEAD) == len(tables) >= 2, "every demo table in the README follows a demo_results marker"
    entries = {(e["family"], e["seed"]): e for e in read_results(RESULTS)}
    for family, seed, table in tables:
        assert (family, seed) in entries, f"README: no entry {family} seed {seed} in {RESULTS.name}"
        rows = entries[family, seed]["rows"]
        assert {"baseline", "sft", "grpo"} <= set(rows)
        assert table.rstrip("\n") == comparison_table(rows), f"README's {family} seed {seed} table"


def test_the_recorded_qwen2_5_vl_seed_0_demo_ran_under_the_committed_lock():
    entries = {(e["family"], e["seed"]): e for e in read_results(RESULTS)}
    lock = hashlib.sha256((REPO_ROOT / "scripts" / "locks" / "venv.txt").read_bytes()).hexdigest()
    assert entries["qwen2_5_vl", 0]["lock_sha256"] == lock, "a lock refresh re-runs the demo (README, Locks)"


def test_record_replaces_the_entry_of_the_same_family_and_seed(tmp_path):
    path = tmp_path / "r.json"
    metrics = {"n": 200, "R1@0.3": 55.0, "R1@0.5": 32.5, "R1@0.7": 15.5, "mIoU": 35.333, "length_ratio": 1.01,
               "format_rate": None, "by_scoring": {}}
    assert row_of(metrics) == {"R1@0.3": 55.0, "R1@0.5": 32.5, "R1@0.7": 15.5, "mIoU": 35.333, "length_ratio": 1.01,
                               "n": 200}
    record(path, {"family": "qwen3_vl", "seed": 0, "rows": {"sft": {"mIoU": 1.0}}})
    record(path, {"family": "qwen2_5_vl", "seed": 1, "rows": {"sft": {"mIoU": 2.0}}})
    first = path.read_bytes()
    record(path, {"family": "qwen2_5_vl", "seed": 1, "rows": {"sft": {"mIoU": 2.0}}})
    assert path.read_bytes() == first  # the same figures: the same bytes
    entries = record(path, {"family": "qwen3_vl", "seed": 0, "rows": {"sft": {"mIoU": 3.0}}})
    assert [(e["family"], e["seed"], e["rows"]["sft"]["mIoU"]) for e in entries] == [("qwen2_5_vl", 1, 2.0),
                                                                                     ("qwen3_vl", 0, 3.0)]
    assert json.loads(path.read_text())["entries"] == entries
    path.write_text("[]")
    with pytest.raises(ValueError, match=r"r\.json: not a demo results file"):
        read_results(path)


def test_the_data_digest_leaves_out_the_tools_record(tmp_path):
    """demo-data's own record (what it wrote) is not part of the data's digest: the clips and splits are."""
    from grounding_rl.dev import demo, tiny
    from grounding_rl.dev.demo_results import TOOL_RECORDS, tree_sha256

    assert set(TOOL_RECORDS) == {demo.RECORD, tiny.RECORD}
    (tmp_path / "train.jsonl").write_text("{}\n")
    before = tree_sha256(tmp_path)
    (tmp_path / demo.RECORD).write_text('{"tool": "demo-data", "files": ["train.jsonl"]}')
    assert tree_sha256(tmp_path) == before
    (tmp_path / "test.jsonl").write_text("{}\n")
    assert tree_sha256(tmp_path) != before
