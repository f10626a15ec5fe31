"""The fault-injection suite (benchmarks/fault_injection.py, issue 23): its classifier flags what it
must, and a few of its cases run here as they run in the script, so it cannot rot."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import fault_injection as fi
from benchmarks.fault_injection import CANARY, Case, Outcome, classify

REFUSED = Case("refused", "config", ("retrieval.bm25.k1=-1",), shows=("retrieval.bm25.k1",))
SUCCEEDS = Case("succeeds", "control", (), exit=(0,))
LINE = "rag_ablate: error: retrieval.bm25.k1 must be >= 0, got -1.0\n"


def test_a_clear_error_and_a_success_are_clean() -> None:
    assert classify(REFUSED, Outcome(2, "", LINE)).status == "clear error"
    assert classify(SUCCEEDS, Outcome(0, "table\n", "")).status == "ok"


def test_the_classifier_flags_each_problem() -> None:
    tb = "Traceback (most recent call last):\n  File x\nValueError: boom\n"
    assert classify(REFUSED, Outcome(2, "", tb + LINE)).problems == ["traceback"]
    assert classify(REFUSED, Outcome(0, "table\n", "")).problems == ["silent wrong"]  # must have failed
    assert classify(SUCCEEDS, Outcome(0, "", "", wrong="all/n_failed=8")).problems == ["silent wrong"]
    assert classify(REFUSED, Outcome(2, "", LINE, leaks=["terminal: key"])).problems == ["leak"]
    assert classify(REFUSED, Outcome(None, "", "")).problems == ["hang"]
    # the wrong exit code, no one-line message, or a line that does not name the setting
    assert classify(REFUSED, Outcome(1, "", LINE)).problems == ["unclear"]
    assert classify(REFUSED, Outcome(2, "", "Error merging override\nSet HYDRA_FULL_ERROR=1\n")).problems == [
        "unclear"
    ]
    assert classify(REFUSED, Outcome(2, "", "rag_ablate: error: bad value\n")).problems == ["unclear"]
    serve = Case("serve", "serve", ("deep",), program="serve", exit=(400,))
    assert classify(serve, Outcome(400, '{"error": "too deep", "field": "body"}', "")).status == "clear error"
    assert classify(serve, Outcome(500, "Internal Server Error", "")).problems == ["unclear"]


def test_leaks_are_found_in_files_bytes_and_the_terminal_in_every_stored_form(tmp_path: Path) -> None:
    out = tmp_path / "outputs"
    (out / "runs").mkdir(parents=True)
    (out / "runs" / "config.yaml").write_text(f"auth: Bearer {CANARY}\n", encoding="utf-8")
    (out / "mlflow.db").write_bytes(b"\x00\x01" + b"15912345678" + b"\x00")  # its digits, NFKC
    (out / "records.jsonl").write_text('{"q": "zhang\\uff20\\u4f8b"}\n', encoding="utf-8")  # JSON-escaped
    found = fi.find_leaks(out, "printed: ***", (CANARY, "１５９１２３４５６７８", "zhang＠例"))
    assert found == [
        "mlflow.db: １５９１２３４５６７８",
        "records.jsonl: zhang＠例",
        f"runs/config.yaml: {CANARY}",
    ]
    assert fi.find_leaks(out, f"key {CANARY}", (CANARY,))[-1] == f"terminal: {CANARY}"
    assert fi.find_leaks(tmp_path / "none", "", (CANARY,)) == []


def test_the_catalogue_covers_the_issue_s_classes() -> None:
    kinds = {c.kind for c in fi.CATALOGUE}
    assert {"config", "dataset", "secrets", "privacy", "env", "disk", "tracking", "http", "serve"} <= kinds
    assert {"sweep folder", "resume"} <= kinds and len(fi.CATALOGUE) >= 40
    names = [c.name for c in fi.CATALOGUE]
    assert len(names) == len(set(names))
    assert all(c.secrets for c in fi.CATALOGUE if c.kind in ("secrets", "privacy"))
    assert set(fi.REQUESTS) == {c.argv[0] for c in fi.CATALOGUE if c.program == "serve"}


SUBSET = (  # one case of each way the script runs a case (the whole catalogue: the script itself)
    "query id with NUL",  # a bad dataset: python -m rag_ablate, a clear error
    "literal Authorization header",  # a key passed carelessly, against rag-ablate serve, grepped for
    "serve: deep",  # an HTTP request to rag-ablate serve under a hostile body
)


@pytest.mark.slow
def test_a_representative_subset_runs_clean(tmp_path: Path) -> None:
    cases = [c for c in fi.CATALOGUE if c.name in SUBSET]
    assert len(cases) == len(SUBSET)
    verdicts = fi.run_all(cases, tmp_path, jobs=2, say=lambda _line: None)
    assert [(v.case.name, v.status, v.why) for v in verdicts if v.problems] == []
    assert fi.counts(verdicts)["attempts"] == len(SUBSET)
    section = fi.markdown(verdicts, 1.0, "python benchmarks/fault_injection.py --only ...")
    assert "| 3 | 2 | 1 | 0 | 0 | 0 | 0 | 0 |" in section
    results = tmp_path / "RESULTS.md"
    results.write_text("# Benchmark results\n\n## Before\n\ntext\n", encoding="utf-8")
    fi.write_results(section, results)
    fi.write_results(section, results)  # replaced in place, not added twice
    text = results.read_text(encoding="utf-8")
    assert text.count("## Fault injection") == 1 and text.startswith("# Benchmark results\n\n## Before\n")
