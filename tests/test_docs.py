"""The documentation stays true: self-contained, linked correctly, complete, and
its worked examples agree with the code.

* No file a user gets (the package, the Hydra plugin, conf/, README.md, docs/,
  pyproject.toml) points at the design notes the project was built from, which
  users do not have.
* Every relative link in README.md and docs/*.md reaches an existing file, and an
  ``#anchor`` reaches an existing heading of that file.
* Every metric in the metric registry and every name ``aggregate`` writes to
  ``metrics.json`` is documented in docs/metrics.md (the names of the other
  registries are checked by tests/test_registry.py).
* The worked examples in docs/metrics.md and the example datasets in
  docs/dataset-format.md give, when run through the code, what the docs say.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterator
from pathlib import Path

import pytest

from rag_ablate.dataset.load import load_dataset
from rag_ablate.metrics.intent import intent_report, intent_top1
from rag_ablate.metrics.registry import REGISTRY
from rag_ablate.metrics.retrieval import evidence_recall, retrieval_metrics
from rag_ablate.records.scoring import aggregate
from rag_ablate.text.count import count_tokens

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
README = ROOT / "README.md"

# What a user of the project does not have: the design folder and its files.
FORBIDDEN = (
    "shared/design",
    "METRICS.md",
    "DATASET_FORMAT.md",
    "STATISTICS.md",
    "ARCHITECTURE.md",
    "STACK_NOTES.md",
    "design folder",
)
SKIP_DIRS = {"__pycache__", ".mypy_cache", ".ruff_cache", ".pytest_cache"}


def _user_facing_files() -> Iterator[Path]:
    for folder in (ROOT / "rag_ablate", ROOT / "hydra_plugins", ROOT / "conf", DOCS):
        for path in sorted(folder.rglob("*")):
            if path.is_file() and not SKIP_DIRS.intersection(path.relative_to(ROOT).parts):
                yield path
    yield README
    yield ROOT / "pyproject.toml"


def _markdown_files() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


_FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.M | re.S)
_INLINE_CODE = re.compile(r"`[^`\n]*`")
_LINK = re.compile(r"!?\[[^\]\n]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.M)


def _prose(text: str) -> str:
    """Markdown without code blocks and inline code (links and headings live outside them)."""
    return _INLINE_CODE.sub("", _FENCE.sub("", text))


def _slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading keeps its text
    text = text.replace("`", "").strip().lower()
    kept = "".join(
        ch
        for ch in text
        if ch in " -_" or unicodedata.category(ch)[0] in "LN" or unicodedata.category(ch) == "Mn"
    )
    return kept.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    anchors: set[str] = set()
    for heading in _HEADING.findall(_FENCE.sub("", path.read_text(encoding="utf-8"))):
        slug = _slug(heading)
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        anchors.add(slug if n == 0 else f"{slug}-{n}")
    return anchors


def test_no_pointer_to_the_design_notes() -> None:
    hits: list[str] = []
    for path in _user_facing_files():
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue  # binary file
        for lineno, line in enumerate(text.splitlines(), start=1):
            for needle in FORBIDDEN:
                if needle in line:
                    hits.append(f"{path.relative_to(ROOT)}:{lineno}: {needle!r}: {line.strip()[:100]}")
    assert not hits, "files point at the design notes (use docs/<file>.md instead):\n" + "\n".join(hits)


def test_every_relative_link_reaches_a_file_and_heading() -> None:
    broken: list[str] = []
    checked = 0
    for md in _markdown_files():
        for target in _LINK.findall(_prose(md.read_text(encoding="utf-8"))):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto: ...
                continue
            checked += 1
            file_part, _, anchor = target.partition("#")
            dest = md if not file_part else (md.parent / file_part).resolve()
            where = f"{md.relative_to(ROOT)}: ({target})"
            if not dest.exists():
                broken.append(f"{where}: no such file {dest}")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                broken.append(f"{where}: no heading with anchor '#{anchor}' in {dest.name}")
    assert checked >= 8, f"expected README and docs to link each other; found {checked} relative links"
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_every_table_row_has_as_many_cells_as_its_header() -> None:
    """An unescaped ``|`` inside a cell (even inside backticks) splits it and breaks the table."""
    bad: list[str] = []
    for md in _markdown_files():
        header_cells: int | None = None
        lines = _FENCE.sub(lambda m: "\n" * m[0].count("\n"), md.read_text(encoding="utf-8")).splitlines()
        for lineno, line in enumerate(lines, start=1):
            if not line.startswith("|"):
                header_cells = None
                continue
            cells = len(re.split(r"(?<!\\)\|", line.strip())) - 2
            if header_cells is None:
                header_cells = cells
            elif cells != header_cells:
                bad.append(f"{md.relative_to(ROOT)}:{lineno}: {cells} cells, header has {header_cells}")
    assert not bad, "table rows that do not match their header (escape | as \\|):\n" + "\n".join(bad)


def _documented_names(text: str) -> set[str]:
    """Every name written as code in a markdown text, with ``@k``/``_at_<n>`` folded to ``_at_k``."""
    names: set[str] = set()
    for span in re.findall(r"`([^`\n]+)`", text):
        for token in re.findall(r"[A-Za-z0-9_<>@.:-]+", span):
            names.add(token)
            names.add(re.sub(r"(_at_|@)(\d+|<k>|k)$", "_at_k", token))
    return names


def undocumented_metrics() -> list[str]:
    """Every metric registered right now (a test may add one) that docs/metrics.md does not name,
    as it is written there (``recall_at_k``, ``intent_top1``)."""
    documented = _documented_names((DOCS / "metrics.md").read_text(encoding="utf-8"))
    missing = []
    for base in REGISTRY:
        spec = REGISTRY[base]
        name = f"{base}_at_k" if spec.takes_k else base
        if name not in documented:
            missing.append(name)
    return missing


def test_every_registered_metric_is_documented() -> None:
    assert {"recall", "ndcg", "intent_top1", "latency_ms"} <= set(REGISTRY)
    missing = undocumented_metrics()
    assert not missing, f"metrics registered but not documented in docs/metrics.md: {missing}"


def test_the_adding_a_metric_recipe_lists_every_metricspec_field_with_its_default() -> None:
    from dataclasses import MISSING, fields

    from rag_ablate.metrics.registry import MetricSpec

    rows = _table(_section(DOCS / "metrics.md", "Adding a metric"))
    documented: dict[str, str] = {}
    for cells in rows:
        for name in cells[0].split(","):
            documented[name.strip().strip("`")] = cells[1]
    spelt = {MISSING: "required", None: "none", False: "false", True: "true"}
    expected = {f.name: spelt.get(f.default, str(f.default).join("``")) for f in fields(MetricSpec)}
    assert {k: v.strip("`") for k, v in documented.items()} == {k: v.strip("`") for k, v in expected.items()}


def test_every_name_in_metrics_json_is_documented() -> None:
    records = [
        {"split": "dev", "kind": "answerable", "status": "ok", "ttft_ms": 80.0,
         "metrics": {"recall_at_5": 1.0, "latency_ms": 12.0}},
        {"split": "holdout", "kind": "no_rag", "status": "failed", "metrics": {}},
        {"split": "holdout", "kind": "answerable", "status": "timeout", "metrics": {"latency_ms": 30000.0}},
    ]  # fmt: skip
    documented = _documented_names((DOCS / "metrics.md").read_text(encoding="utf-8"))
    names = {key.rpartition("/")[2] for key in aggregate(records)}
    assert {"n_queries", "n_failed", "error_rate", "latency_ms_p95"} <= names

    def generic(name: str) -> str:  # recall_at_5 -> recall_at_k, n_status_timeout -> n_status_<status>
        name = re.sub(r"_at_\d+$", "_at_k", name)
        return re.sub(r"^(n_status|error_rate)_[a-z_]+$", r"\1_<status>", name)

    missing = sorted(n for n in names if generic(n) not in documented)
    assert not missing, f"names in metrics.json not documented in docs/metrics.md: {missing}"


# --------------------------------------------------------------------------- worked examples


def _section(path: Path, heading: str) -> str:
    """The text under a heading, up to the next heading of the same or a higher level."""
    text = path.read_text(encoding="utf-8")
    match = re.search(rf"^(#+) {re.escape(heading)}\s*$", text, re.M)
    assert match, f"{path.name} has no heading '{heading}'"
    level = len(match[1])
    rest = text[match.end() :]
    end = re.search(rf"^#{{1,{level}}} ", _FENCE.sub(lambda m: " " * len(m[0]), rest), re.M)
    return rest[: end.start()] if end else rest


def _table(section: str) -> list[list[str]]:
    """Body rows of the first markdown table in a section, cells stripped of backticks."""
    rows: list[list[str]] = []
    for line in section.splitlines():
        if not line.startswith("|"):
            if rows:
                break
            continue
        if not re.fullmatch(r"\|[\s:|-]+\|", line.strip()):  # not the |---|---| line
            rows.append([c.strip().strip("`") for c in line.strip().strip("|").split("|")])
    return rows[1:]  # without the header


def _number(cell: str) -> float:
    """``1/3 = 0.3333`` -> 0.3333; ``0.5`` -> 0.5."""
    return float(cell.rpartition("=")[2].strip())


def test_retrieval_worked_example_matches_the_code() -> None:
    section = _section(DOCS / "metrics.md", "Worked example")
    assert '["X", "A", "A", "Y", "B", "C"]' in section and '{"A": 3, "B": 1, "C": 1}' in section
    rows = _table(section)
    ks = [int(r[0]) for r in rows]
    assert ks == [1, 3, 5, 10]
    got = retrieval_metrics(["X", "A", "A", "Y", "B", "C"], {"A": 3, "B": 1, "C": 1}, ks)
    for row in rows:
        k = row[0]
        documented = dict(
            zip(["hit", "recall", "precision", "mrr", "ndcg", "full_recall"], row[3:], strict=True)
        )
        for base, cell in documented.items():
            assert got[f"{base}_at_{k}"] == pytest.approx(_number(cell), abs=5e-5), (base, k)


def test_evidence_recall_worked_example_matches_the_code() -> None:
    section = _section(DOCS / "metrics.md", "evidence_recall (chunk-size aware)")
    rows = _table(section.split("### Worked example")[1])
    evidence = [("A", 100, 160), ("A", 400, 420), ("B", 0, 30)]
    chunks = [("A", 0, 128), ("X", 0, 256), ("A", 384, 512)]
    assert "`(A, 100, 160)`, `(A, 400, 420)`, `(B, 0, 30)`" in section
    assert [int(r[0]) for r in rows] == [1, 2, 3]
    for row in rows:
        assert evidence_recall(chunks, evidence, int(row[0])) == pytest.approx(_number(row[3]), abs=5e-5)
    assert evidence_recall([("A", 0, 512)], evidence, 1) == pytest.approx(2 / 3)  # "both spans of A: 2/3"
    assert evidence_recall([("B", 30, 60)], [("B", 0, 30)], 1) == 0.0  # touching is no overlap


def test_token_counting_table_matches_the_code() -> None:
    rows = _table(_section(DOCS / "metrics.md", "context_tokens and the token counting rule"))
    assert len(rows) >= 5
    for text, tokens, _why in rows:
        assert count_tokens(text) == int(tokens), text


def _example_datasets() -> dict[str, dict[str, str]]:
    """The JSON Lines blocks under "## Examples" of dataset-format.md, per "###" example and file."""
    examples: dict[str, dict[str, str]] = {}
    current = ""
    last_file = ""
    body = _section(DOCS / "dataset-format.md", "Examples")
    for block in re.finditer(r"^### ([^\n]+)$|^`(\w+\.jsonl)`|^```json\n(.*?)^```", body, re.M | re.S):
        heading, file_name, jsonl = block.groups()
        if heading:
            current = heading.strip()
        elif file_name:
            last_file = file_name
        elif jsonl is not None:
            assert current and last_file, (
                "an example block must follow a ### heading and a `file.jsonl` label"
            )
            examples.setdefault(current, {})[last_file] = jsonl
    return examples


def test_dataset_format_examples_validate(tmp_path: Path) -> None:
    examples = _example_datasets()
    assert len(examples) == 2
    kinds: dict[str, str] = {}
    splits: dict[str, str] = {}
    for i, files in enumerate(examples.values()):
        assert {"corpus.jsonl", "queries.jsonl"} <= set(files)
        folder = tmp_path / str(i)
        folder.mkdir()
        for name, content in files.items():
            (folder / name).write_text(content, encoding="utf-8")
        dataset = load_dataset(folder)
        kinds.update({q.query_id: q.kind for q in dataset.queries})
        splits.update({q.query_id: q.split for q in dataset.queries})
    # What the text around the examples says about them.
    assert kinds == {
        "zh_001": "answerable", "zh_002": "answerable", "zh_003": "answerable",
        "zh_004": "unanswerable", "zh_005": "no_rag",
        "en_01": "answerable", "en_02": "answerable", "en_03": "unanswerable", "en_04": "no_rag",
    }  # fmt: skip
    assert splits["zh_002"] == splits["zh_003"] == "holdout"


def test_intent_worked_example_matches_the_code() -> None:
    section = _section(DOCS / "metrics.md", "intent_top1 and the per-intent report").split(
        "### Worked example"
    )[1]
    rows = _table(section)
    cases = [(l1, l2, None if pred == "(none)" else pred) for l1, l2, pred, _ in rows]
    report = intent_report(cases)
    for (_gold_l1, gold_l2, predicted), row in zip(cases, rows, strict=True):
        assert intent_top1(gold_l2, predicted) == float(row[3]), row
    assert f"Overall {report.correct}/{report.n} = {report.accuracy:g}" in section
    worst_first = ", ".join(f"{r.name} {r.correct}/{r.n} = {r.accuracy:.3f}" for r in report.per_l1)
    assert worst_first in " ".join(section.split())
    confusions = ", ".join(f"`{gold} -> {pred}`" for gold, pred, _ in report.confusions)
    assert confusions in " ".join(section.split())


def test_counts_worked_example_matches_the_code() -> None:
    section = _section(DOCS / "metrics.md", "Worked example: one split, five queries")
    records = []
    for _query, kind, status, values in _table(section):
        metrics = {name: float(v) for name, v in re.findall(r"(\w+) = ([0-9.]+)", values)}
        records.append({"split": "dev", "kind": kind, "status": status.split()[0], "metrics": metrics})
    assert len(records) == 5
    got = aggregate(records)
    claims = {}
    for span in re.findall(r"`([^`\n]+)`", section.split("Gives", 1)[1]):
        match = re.fullmatch(r"(\w+) = .*?([0-9.]+)", span)
        if match:
            claims[match[1]] = float(match[2])
    assert len(claims) >= 10, claims
    for name, value in claims.items():
        assert got[f"dev/{name}"] == pytest.approx(value), name


def test_evidence_coverage_and_judged_worked_examples_match_the_code() -> None:
    from rag_ablate.metrics.retrieval import bpref, evidence_coverage_at, judged_at

    section = _section(DOCS / "metrics.md", "evidence_coverage (how much of the evidence the chunks hold)")
    evidence = [("A", 100, 160), ("B", 0, 40)]
    x = [("A", 0, 512), ("B", 0, 512)]
    y = [("A", 128, 256), ("B", 0, 128), ("A", 0, 128)]
    assert "`(A, 100, 160)` (60 characters) and `(B, 0, 40)`" in section
    rows = _table(section)
    ks = [int(r[0]) for r in rows]
    assert ks == [1, 2, 3]
    for row, y_cov, x_cov in zip(
        rows, evidence_coverage_at(y, evidence, ks), evidence_coverage_at(x, evidence, ks), strict=True
    ):
        assert evidence_recall(y, evidence, int(row[0])) == pytest.approx(_number(row[4]), abs=5e-5)
        assert (y_cov, x_cov) == (
            pytest.approx(_number(row[5]), abs=5e-5),
            pytest.approx(_number(row[6]), abs=5e-5),
        )

    section = _section(DOCS / "metrics.md", "judged and bpref (unlabelled documents)")
    labels = {"r1": 2, "r2": 1, "r3": 1, "n1": 0, "n2": 0}
    ranking = ["n1", "x", "r1", "n2", "x", "r2"]
    rows = _table(section.split("### Worked example: judged and bpref")[1])
    got = judged_at(ranking, labels, [int(r[0]) for r in rows])
    for row in rows:
        assert got[f"judged_at_{row[0]}"] == pytest.approx(_number(row[3]), abs=5e-5)
    assert "`bpref = (0.5 + 0) / 3 = 0.1667`" in section and bpref(ranking, labels) == pytest.approx(
        0.1667, abs=5e-5
    )
