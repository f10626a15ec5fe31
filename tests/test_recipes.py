"""Each recipe of docs/architecture.md "Extending rag_ablate" works with exactly the files it names.

A test per recipe copies the package, conf/, README.md and docs/ into a temporary folder, follows
the recipe there literally (writes the new module, edits the files the recipe names, nothing
else), checks that the files it touched are exactly the recipe's list, and then uses the new
extension through the real entry points of the copy: a run of the embedded sample with
``retrieval=<new>``, ``rerank=<new>`` or ``system=<new>``, ``rag-ablate import <new>`` followed
by ``rag-ablate validate``, or a sweep whose comparison shows the new section in every view (the
terminal, comparison.md and .json, report.html, the MLflow descriptions). The registry checks
of tests/test_registry.py (a config file per name, a mention in README or docs/) are applied to
the copy as well, so a recipe that forgot a file fails here. The file count of each recipe is
read from the doc, so the doc and the tests cannot drift apart.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from rag_ablate.dataset.load import load_dataset

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "architecture.md"
COPIED = ("rag_ablate", "hydra_plugins", "conf", "docs", "README.md")

# the number of files each recipe names; the doc must say the same (test_recipe_file_counts)
FILE_COUNTS = {
    "retriever": 3,
    "reranker": 3,
    "system": 4,
    "importer": 3,
    "metric": 3,  # followed at run time by the metric registry's own tests (tests/test_metrics_registry.py)
    "comparison or report section": 8,
}


# --------------------------------------------------------------------------- the doc


def recipe(kind: str) -> list[str]:
    """The files the recipe "How to add a <kind>" names, in order (``<name>`` left as written)."""
    text = DOC.read_text(encoding="utf-8")
    m = re.search(rf"^### How to add an? {re.escape(kind)}\n(.*?)(?=^##|\Z)", text, re.M | re.S)
    assert m, f"docs/architecture.md has no section '### How to add a {kind}'"
    body = m[1]
    head = re.search(r"^Files to touch \((\d+)\):\n\n((?:\d+\. .*\n(?:   .*\n)*)+)", body, re.M)
    assert head, f"'How to add a {kind}' has no 'Files to touch (N):' list"
    files = re.findall(r"^\d+\. `([^`]+)`", head[2], re.M)
    assert len(files) == int(head[1]), f"'How to add a {kind}' says {head[1]} files and lists {files}"
    return files


@pytest.mark.parametrize("kind", sorted(FILE_COUNTS))
def test_recipe_file_counts(kind: str) -> None:
    assert len(recipe(kind)) == FILE_COUNTS[kind]


# --------------------------------------------------------------------------- a copy to follow a recipe in


def _copy(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    root.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in COPIED:
        src = REPO / name
        if src.is_dir():
            shutil.copytree(src, root / name, ignore=ignore)
        else:
            shutil.copy2(src, root / name)
    return root


def _touched(root: Path) -> set[str]:
    """Files of the copy that are new or differ from the repository's."""
    out = set()
    for path in root.rglob("*"):
        rel = path.relative_to(root)
        if not path.is_file() or rel.parts[0] not in COPIED or "__pycache__" in rel.parts:
            continue
        orig = REPO / rel
        if not orig.is_file() or orig.read_bytes() != path.read_bytes():
            out.add(rel.as_posix())
    return out


def _expected(kind: str, **names: str) -> set[str]:
    files = set()
    for f in recipe(kind):
        for placeholder, value in names.items():
            f = f.replace(f"<{placeholder}>", value)
        files.add(f)
    return files


def _env(root: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(root)
    return env


def _python(root: Path, *args: str, timeout: float = 300) -> str:
    proc = subprocess.run(
        [sys.executable, *args], cwd=root, env=_env(root), capture_output=True, text=True, timeout=timeout
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return proc.stdout


def _run_sample(root: Path, *overrides: str) -> list[dict[str, Any]]:
    """A run of the embedded sample in the copy (no MLflow, no router); its records."""
    out = _python(
        root, "-m", "rag_ablate", *overrides, "tracking=none", "progress=false", "router=none",
        f"paths.output_root={root / 'outputs'}",
    )  # fmt: skip
    (records,) = (root / "outputs" / "runs").glob("*/records.jsonl")
    assert str(records) in out
    return [json.loads(line) for line in records.read_text(encoding="utf-8").splitlines()]


def _registered(root: Path, module: str, registry: str) -> list[str]:
    script = f"from {module} import {registry}; import json; print(json.dumps(list({registry}.names())))"
    return list(json.loads(_python(root, "-c", script)))


def _check_registry_rules(root: Path, names: list[str], group: str | None) -> None:
    """tests/test_registry.py's rules on the copy: a config file per name and back, each name documented."""
    if group is not None:
        assert set(names) == {p.stem for p in (root / "conf" / group).glob("*.yaml")}
    pages = [root / "README.md", *(root / "docs").glob("*.md")]
    docs = "\n".join(p.read_text(encoding="utf-8") for p in pages)
    assert [n for n in names if f"`{n}`" not in docs] == []


def _write(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip(), encoding="utf-8")


def _edit(root: Path, rel: str, old: str, new: str) -> None:
    path = root / rel
    text = path.read_text(encoding="utf-8")
    assert text.count(old) == 1, f"{rel}: {old!r} is not there exactly once"
    path.write_text(text.replace(old, new), encoding="utf-8")


def _before(root: Path, rel: str, anchor: str, new: str) -> None:
    _edit(root, rel, anchor, new + anchor)


def _after(root: Path, rel: str, anchor: str, new: str) -> None:
    _edit(root, rel, anchor, anchor + new)


def _add_option(root: Path, group: str, name: str, what: str, section_line: str | None = None) -> None:
    """README's "Config groups" table: ``name`` appended to the options of ``group``; and
    ``section_line`` added to "Retrieval, fusion and reranking" when given."""
    text = (root / "README.md").read_text(encoding="utf-8")
    (row,) = [line for line in text.splitlines() if line.startswith(f"| `{group}` | ")]
    cells = row.split(" | ")
    cells[1] += f", `{name}` ({what})"
    _edit(root, "README.md", row, " | ".join(cells))
    if section_line is not None:
        end = "\nWithout a reranker `retrieval.top_k` chunks are returned"
        _edit(root, "README.md", end, f"{section_line}\n{end}")


# --------------------------------------------------------------------------- the recipes


@pytest.mark.slow
def test_how_to_add_a_retriever(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    _write(
        root,
        "rag_ablate/pipeline/retrievers/first_chunks.py",
        '''
        """``retrieval=first_chunks``: the first k chunks in index order, scored 1/rank."""

        from __future__ import annotations

        import time
        from typing import Any

        from rag_ablate.pipeline.stages import RETRIEVERS, Hits, QueryState, Resources


        @RETRIEVERS.register("first_chunks")
        class FirstChunks:
            def __init__(self, settings: Any) -> None:
                self.n = 0

            def prepare(self, res: Resources) -> dict[str, Any]:
                self.n = len(res.chunks)
                return {"retrieval.first_chunks.n": self.n}

            @property
            def nbytes(self) -> int:
                return 0

            def search(self, state: QueryState, k: int) -> Hits:
                start = time.perf_counter()
                hits = [(i, 1.0 / (i + 1)) for i in range(min(k, self.n))]
                state.timed("first_chunks", start)
                return hits
        ''',
    )
    _write(root, "conf/retrieval/first_chunks.yaml", "# The first chunks.\nmethod: first_chunks\ntop_k: 3\n")
    _add_option(
        root, "retrieval", "first_chunks", "a floor", "* **`retrieval=first_chunks`**: the first chunks."
    )
    assert _touched(root) == _expected("retriever", name="first_chunks")

    records = _run_sample(root, "retrieval=first_chunks")
    first_doc = next(iter(load_dataset(None).documents))
    assert len(records) == len(load_dataset(None).queries)
    for rec in records:
        assert rec["status"] == "ok"
        hits = rec["retrieved"]
        assert isinstance(hits, list)
        assert [h["score"] for h in hits] == [1.0, 0.5, 1 / 3]
        assert hits[0]["chunk_id"] == f"{first_doc}#0"
        assert "first_chunks" in rec["timings_ms"]
    _check_registry_rules(root, _registered(root, "rag_ablate.pipeline.stages", "RETRIEVERS"), "retrieval")


@pytest.mark.slow
def test_how_to_add_a_reranker(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    _write(
        root,
        "rag_ablate/pipeline/rerank_reverse.py",
        '''
        """``rerank=reverse``: the candidates in reverse order (the last one first), scored by position."""

        from __future__ import annotations

        import time
        from typing import Any

        from rag_ablate.pipeline.stages import RERANKERS, Hits, QueryState, Resources


        @RERANKERS.register("reverse")
        class Reverse:
            def __init__(self, settings: Any) -> None:
                pass

            def prepare(self, res: Resources) -> dict[str, Any]:
                return {}

            def rerank(self, state: QueryState, hits: Hits, top_k: int) -> Hits:
                start = time.perf_counter()
                out = [(i, float(n)) for n, (i, _) in zip(range(len(hits), 0, -1), reversed(hits))]
                state.timed("reverse", start)
                return out[:top_k]

            def close(self) -> None:
                pass
        ''',
    )
    _write(root, "conf/rerank/reverse.yaml", "# Backwards.\nmethod: reverse\ntop_k: 3\ncandidates: 5\n")
    _add_option(root, "rerank", "reverse", "backwards", "* **`rerank=reverse`**: the candidates backwards.")
    assert _touched(root) == _expected("reranker", name="reverse")

    records = _run_sample(root, "rerank=reverse")
    full = 0
    for rec in records:
        assert rec["status"] == "ok"
        hits = rec["retrieved"]
        assert isinstance(hits, list)
        # n <= 5 BM25 candidates, the last first, scored n, n - 1, ...; three kept
        scores = [h["score"] for h in hits]
        if scores:
            top = int(scores[0])
            assert top <= 5 and scores == [float(n) for n in range(top, max(top - 3, 0), -1)]
        full += scores == [5.0, 4.0, 3.0]
        assert {"reverse", "rerank"} <= set(rec["timings_ms"])
    assert full > len(records) / 2  # most queries have five candidates or more
    _check_registry_rules(root, _registered(root, "rag_ablate.pipeline.stages", "RERANKERS"), "rerank")


@pytest.mark.slow
def test_how_to_add_a_system(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    _write(
        root,
        "rag_ablate/systems/first_doc.py",
        '''
        """``system=first_doc``: every query answered with the corpus's first document, whole."""

        from __future__ import annotations

        from typing import Any

        from rag_ablate.dataset.model import Dataset, Query
        from rag_ablate.records.trace import RetrievedChunk, Trace
        from rag_ablate.systems import SYSTEMS


        @SYSTEMS.register("first_doc")
        class FirstDoc:
            routes_intents = False

            def __init__(self, settings: Any, cache: Any) -> None:
                self.hit: RetrievedChunk | None = None

            def prepare(self, dataset: Dataset) -> dict[str, Any]:
                doc = next(iter(dataset.documents.values()))
                self.hit = RetrievedChunk(1, f"{doc.doc_id}#all", doc.doc_id, 0, len(doc.text), 1.0)
                return {"first_doc.doc_id": doc.doc_id}

            def run(self, query: Query) -> Trace:
                assert self.hit is not None
                return Trace(query.query_id, retrieved=[self.hit], answer="see the first document")

            def close(self) -> None:
                self.hit = None
        ''',
    )
    _edit(
        root,
        "rag_ablate/systems/__init__.py",
        '"rag_ablate.systems.replay")',
        '"rag_ablate.systems.replay", "rag_ablate.systems.first_doc")',
    )
    _write(root, "conf/system/first_doc.yaml", "# Every query gets the first document.\nname: first_doc\n")
    _add_option(root, "system", "first_doc", "the first document for every query")
    assert _touched(root) == _expected("system", name="first_doc")

    records = _run_sample(root, "system=first_doc")
    doc = next(iter(load_dataset(None).documents.values()))
    assert records and all(r["status"] == "ok" and r["answer"] == "see the first document" for r in records)
    for rec in records:
        assert rec["retrieved"] == [
            {"rank": 1, "chunk_id": f"{doc.doc_id}#all", "doc_id": doc.doc_id, "start": 0,
             "end": len(doc.text), "score": 1.0}
        ]  # fmt: skip
    _check_registry_rules(root, _registered(root, "rag_ablate.systems", "SYSTEMS"), "system")


@pytest.mark.slow
def test_how_to_add_an_importer(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    _write(
        root,
        "rag_ablate/dataset/importers/faq.py",
        '''
        """``faq``: a tab-separated file, one ``question<TAB>answer`` a line; each answer is a document."""

        from __future__ import annotations

        from pathlib import Path

        from rag_ablate.core.errors import DatasetError
        from rag_ablate.dataset.importers.common import IMPORTERS, Case, Importer, ImportRun, JsonlWriter


        @IMPORTERS.register("faq")
        class Faq(Importer):
            summary = "a TSV of question<TAB>answer lines"

            def read(self, source: Path, out: JsonlWriter, run: ImportRun, *, doc_unit: str) -> list[Case]:
                cases = []
                for n, line in enumerate(source.read_text(encoding="utf-8").splitlines(), start=1):
                    if not line.strip():
                        continue
                    question, sep, answer = line.partition("\\t")
                    if not sep:
                        raise DatasetError("expected question<TAB>answer", file=str(source), line=n)
                    if not question.strip() or not answer.strip():
                        run.skip(f"line {n}", "empty question or answer")
                        continue
                    doc_id = f"faq_{n}"
                    out.write({"doc_id": doc_id, "text": answer})
                    run.documents += 1
                    evidence = [(doc_id, 0, len(answer))]
                    cases.append(Case(f"q_{n}", question, {doc_id: 1}, evidence, [answer], []))
                return cases
        ''',
    )
    _edit(
        root,
        "rag_ablate/dataset/importers/common.py",
        '"rag_ablate.dataset.importers.clapnq",\n',
        '"rag_ablate.dataset.importers.clapnq",\n        "rag_ablate.dataset.importers.faq",\n',
    )
    _edit(
        root,
        "README.md",
        "rag-ablate import clapnq path/to/clapnq-dev  data/clapnq       # ClapNQ's jsonl files\n",
        "rag-ablate import clapnq path/to/clapnq-dev  data/clapnq       # ClapNQ's jsonl files\n"
        "rag-ablate import faq    faq.tsv             data/faq          # `faq`: question<TAB>answer lines\n",
    )
    assert _touched(root) == _expected("importer", format="faq")

    topics = ["returns", "shipping", "warranty", "payment", "invoices", "accounts", "coupons", "repairs"]
    lines = [f"How do {t} work for orders placed abroad?\tAll about {t}: ask desk {i}." for i, t in
             enumerate(topics)] + ["\tan answer without a question"]  # fmt: skip
    (tmp_path / "faq.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    cli = "from rag_ablate.cli.main import main; import sys; sys.exit(main())"
    out = _python(root, "-c", cli, "import", "faq", str(tmp_path / "faq.tsv"), str(tmp_path / "ds"))
    assert "8 documents, 8 queries" in out and "empty question or answer" in out
    _python(root, "-c", cli, "validate", str(tmp_path / "ds"))
    ds = load_dataset(tmp_path / "ds")
    assert len(ds.documents) == len(ds.queries) == 8
    assert {q.split for q in ds.queries} == {"dev", "holdout"}
    _check_registry_rules(root, _registered(root, "rag_ablate.dataset.importers.common", "IMPORTERS"), None)


REGRESSIONS_TYPES = '''
@dataclass
class Regression:
    """One query of one split whose primary metric dropped in a variant (``drop`` > 0)."""

    split: str
    variant: str
    query_id: str
    query: str
    baseline_value: float
    variant_value: float
    drop: float  # the change against the metric's direction: baseline - variant when higher is better


@dataclass
class RegressionSection:
    """Per split and variant, the ``top`` queries whose ``metric`` dropped most, largest first."""

    metric: str
    top: int
    rows: list[Regression] = field(default_factory=list)

    def of(self, variant: str, split: str) -> list[Regression]:
        return [r for r in self.rows if (r.variant, r.split) == (variant, split)]


'''

REGRESSIONS_RENDER = '''
def regression_terminal_lines(c: Comparison) -> list[str]:
    """Per variant, its largest regressions on every split."""
    if c.regressions is None:
        return []
    sec, out = c.regressions, []
    for v in c.variants:
        parts = [
            f"{s}: " + ", ".join(f"{r.query_id} {_signed(-r.drop)}" for r in sec.of(v, s))
            for s in c.splits
            if sec.of(v, s)
        ]
        if parts:
            out.append(f"largest regressions of {v} on {display_name(sec.metric)}: {'; '.join(parts)}")
    return out


def regression_markdown_lines(c: Comparison) -> list[str]:
    """``comparison.md``'s section: every regression kept, per split and variant."""
    if c.regressions is None:
        return []
    sec = c.regressions
    out = [
        "## Largest regressions",
        "",
        f"Per split and variant, the {sec.top} queries whose {display_name(sec.metric)} dropped most.",
        "",
        "| split | variant | query | base -> var | drop |",
        "|---|---|---|---|---:|",
    ]
    out += [
        f"| {r.split} | {_md_cell(r.variant)} | `{r.query_id}` {_md_cell(r.query)} | "
        f"{_num(r.baseline_value)} -> {_num(r.variant_value)} | {_num(r.drop)} |"
        for r in sec.rows
    ]
    return [*out, ""]


'''

REGRESSIONS_HTML = """
<p>Per split and variant, the {{ c.regressions.top }} largest drops of
<b>{{ c.regressions.metric | metric }}</b>.</p>
<table class="regressions"><thead><tr><th>variant</th><th>split</th><th>query id</th><th>query</th>
<th>baseline</th><th>variant</th><th>drop</th></tr></thead><tbody>
{% for r in c.regressions.rows %}
<tr><td>{{ titles.get(r.variant, r.variant) }}</td><td>{{ r.split }}</td><td>{{ r.query_id }}</td>
<td>{{ r.query }}</td>
<td>{{ r.baseline_value | num }}</td><td>{{ r.variant_value | num }}</td><td>{{ r.drop | num }}</td></tr>
{% endfor %}
</tbody></table>
"""

REGRESSIONS_MLFLOW = '''
def regressions_text(c: Comparison, variant: str) -> str:
    """``q1 (dev -1.000), q7 (holdout -0.500)``; ``''`` when there are none."""
    if c.regressions is None:
        return ""
    rows = [r for r in c.regressions.rows if r.variant == variant]
    return ", ".join(f"{r.query_id} ({r.split} {_signed(-r.drop)})" for r in rows)


'''

REGRESSIONS_SWEEP_NOTE = """\
    if c is not None and c.regressions is not None and c.regressions.rows:
        named = [f"{v}: {regressions_text(c, v)}" for v in c.variants if regressions_text(c, v)]
        metric = display_name(c.regressions.metric)
        lines.append(f"Largest regressions ({metric}): " + "; ".join(named))
"""


@pytest.mark.slow
def test_how_to_add_a_comparison_or_report_section(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    # 1. model.py: the section's types, a field on Comparison (None: not computed), its key in comparison.json
    model = "rag_ablate/compare/model.py"
    _before(root, model, "@dataclass\nclass Comparison:\n", REGRESSIONS_TYPES.lstrip())
    field = "    regressions: RegressionSection | None = None\n"
    _before(root, model, "    tradeoff: Tradeoff | None = None", field)
    to_json = '{**asdict(self.regressions), "rows": [_finite(asdict(r)) for r in self.regressions.rows]}'
    _after(
        root,
        model,
        '            "tradeoff": None if self.tradeoff is None else self.tradeoff.to_dict(),\n',
        '            "regressions": None\n'
        "            if self.regressions is None\n"
        f"            else {to_json},\n",
    )
    # 2. the section's module
    _write(
        root,
        "rag_ablate/compare/regressions.py",
        '''
        """The largest regressions: per split and variant, the queries whose primary metric dropped most.

        The primary metric is the comparison's first. A query counts when it is ``ok`` with a value of
        the metric in the baseline and in the variant; its drop is the change against the metric's
        direction. The ``top`` largest drops are kept, ties by query id.
        """

        from __future__ import annotations

        import math
        from collections.abc import Sequence

        from rag_ablate.compare.model import Comparison, Regression, RegressionSection, VariantData
        from rag_ablate.metrics.registry import direction_of

        TOP = 3


        def _values(v: VariantData, metric: str) -> dict[tuple[str, str], tuple[float, str]]:
            out = {}
            for rec in v.records:
                x = rec["metrics"].get(metric)
                if rec["status"] == "ok" and x is not None and math.isfinite(x):
                    out[(rec["split"], rec["query_id"])] = (float(x), rec.get("query") or "")
            return out


        def largest_regressions(
            variants: Sequence[VariantData], c: Comparison, top: int = TOP
        ) -> RegressionSection | None:
            if not c.metrics:
                return None
            metric = c.metrics[0]
            sign = 1.0 if direction_of(metric) == "higher" else -1.0
            by_label = {v.label: v for v in variants}
            base = _values(by_label[c.baseline], metric)
            rows: list[Regression] = []
            for label in c.variants:
                other = _values(by_label[label], metric)
                for split in c.splits:
                    drops = []
                    for (s, qid), (b, text) in base.items():
                        if s == split and (s, qid) in other:
                            v = other[(s, qid)][0]
                            if sign * (b - v) > 0:
                                drops.append(Regression(split, label, qid, text, b, v, sign * (b - v)))
                    rows += sorted(drops, key=lambda r: (-r.drop, r.query_id))[:top]
            return RegressionSection(metric, top, rows)
        ''',
    )
    # 3. run.py: one line that sets the field
    run = "rag_ablate/compare/run.py"
    _after(
        root,
        run,
        "import pairwise_section\n",
        "from rag_ablate.compare.regressions import largest_regressions\n",
    )
    pairwise = "    c.pairwise = pairwise_section(src.variants, c)\n"
    _after(root, run, pairwise, "    c.regressions = largest_regressions(src.variants, c)\n")
    # 4. render.py: its lines in the terminal and in comparison.md
    render = "rag_ablate/compare/render.py"
    _before(root, render, "def format_markdown(c: Comparison", REGRESSIONS_RENDER.lstrip())
    _before(
        root, render, "    lines += slice_terminal_lines(c)\n", "    lines += regression_terminal_lines(c)\n"
    )
    _before(root, render, "    out += slice_markdown_lines(c)\n", "    out += regression_markdown_lines(c)\n")
    # 5. its template: the <section>'s body in report.html
    _write(root, "rag_ablate/report/templates/sections/regressions.html.j2", REGRESSIONS_HTML)
    # 6. report/html.py: its entry in SECTIONS, left out when not computed
    _after(
        root,
        "rag_ablate/report/html.py",
        '    ("hurts", "Where it hurts", "hurts.html.j2", ""),\n',
        '    ("regressions", "Largest regressions", "regressions.html.j2", "regressions"),\n',
    )
    # 7. report/mlflow_ui.py: its lines in the sweep run's and in each variant run's description
    ui = "rag_ablate/report/mlflow_ui.py"
    _before(root, ui, "    if c is not None and c.confounded:\n", REGRESSIONS_SWEEP_NOTE)
    _before(root, ui, "def child_description(", REGRESSIONS_MLFLOW.lstrip())
    _edit(
        root,
        ui,
        '    return f"{line} Hurts on slices: {hurts} ({SLICES_NOTE})." if hurts else line\n',
        '    line = f"{line} Hurts on slices: {hurts} ({SLICES_NOTE})." if hurts else line\n'
        "    drops = regressions_text(c, variant)\n"
        '    return f"{line} Largest regressions: {drops}." if drops else line\n',
    )
    # 8. docs/statistics.md
    _before(
        root,
        "docs/statistics.md",
        "## Seeds\n",
        "## Largest regressions\n\nPer split and variant, the three queries whose primary metric (the first "
        "of `compare.metrics`) dropped most against the baseline, over the queries `ok` on both sides. "
        "Descriptive: queries to read, not a test.\n\n",
    )
    assert _touched(root) == _expected("comparison or report section", section="regressions")

    # a real sweep of the embedded sample in the copy, MLflow on (a sqlite store in the copy); the
    # section reads the jobs' records, so the timing pass after them is off
    sweep = tmp_path / "sweep"
    out = _python(
        root, "-m", "rag_ablate", "-m", "chunk=256,512", "progress=false", "compare.B=200", "router=none",
        "tracking.traces=none", "timing.interleave=false", f"paths.output_root={root / 'outputs'}",
        f"hydra.sweep.dir={sweep}",
    )  # fmt: skip

    # what the section must hold, worked out here from the jobs' records
    ok: dict[str, dict[tuple[str, str], dict[str, Any]]] = {}
    for job in sorted(p for p in sweep.iterdir() if (p / "records.jsonl").is_file()):
        label = json.loads((job / "variant.json").read_text(encoding="utf-8"))["label"]
        lines = (job / "records.jsonl").read_text(encoding="utf-8").splitlines()
        recs = [json.loads(line) for line in lines]
        ok[label] = {(r["split"], r["query_id"]): r for r in recs if r["status"] == "ok"}
    assert set(ok) == {"baseline", "chunk=256"}
    expected: list[dict[str, Any]] = []
    for split in ("dev", "holdout"):
        drops = []
        for (s, qid), b in ok["baseline"].items():
            v = ok["chunk=256"].get((s, qid))
            if s == split and v is not None:
                bv, vv = b["metrics"].get("recall_at_5"), v["metrics"].get("recall_at_5")
                if bv is not None and vv is not None and bv > vv:
                    row = {"split": split, "variant": "chunk=256", "query_id": qid, "query": b["query"]}
                    drops.append({**row, "baseline_value": bv, "variant_value": vv, "drop": bv - vv})
        assert len(drops) >= 3
        expected += sorted(drops, key=lambda d: (-d["drop"], d["query_id"]))[:3]

    # comparison.json
    data = json.loads((sweep / "comparison.json").read_text(encoding="utf-8"))
    assert data["regressions"] == {"metric": "recall_at_5", "top": 3, "rows": expected}
    # the terminal
    dev = ", ".join(f"{r['query_id']} {-r['drop']:+.3f}" for r in expected[:3])
    holdout = ", ".join(f"{r['query_id']} {-r['drop']:+.3f}" for r in expected[3:])
    assert f"largest regressions of chunk=256 on recall@5: dev: {dev}; holdout: {holdout}" in out.splitlines()
    # comparison.md
    md = (sweep / "comparison.md").read_text(encoding="utf-8")
    assert "\n## Largest regressions\n" in md
    for r in expected:
        text = r["query"].replace("|", "\\|")
        row = f"| {r['split']} | chunk=256 | `{r['query_id']}` {text} | "
        assert row + f"{r['baseline_value']:.3f} -> {r['variant_value']:.3f} | {r['drop']:.3f} |" in md
    # report.html, as the sweep wrote it; then, in the copy, Comparison.from_dict of comparison.json gives
    # the typed section back, and `rag-ablate report` renders report.html again from it
    page = (sweep / "report.html").read_text(encoding="utf-8")
    (sweep / "report.html").unlink()
    script = textwrap.dedent(
        f"""
        import json
        from dataclasses import asdict
        from pathlib import Path
        from rag_ablate.cli.main import main
        from rag_ablate.compare.model import Comparison, Regression, RegressionSection
        c = Comparison.from_dict(json.loads(Path({str(sweep / "comparison.json")!r}).read_text("utf-8")))
        assert isinstance(c.regressions, RegressionSection), c.regressions
        assert [type(r) for r in c.regressions.rows] == [Regression] * 6, c.regressions.rows
        print(json.dumps(asdict(c.regressions)))
        assert main(["report", {str(sweep)!r}]) == 0
        """
    )
    typed = _python(root, "-c", script).splitlines()[0]
    assert json.loads(typed) == data["regressions"]
    for html in (page, (sweep / "report.html").read_text(encoding="utf-8")):
        assert '<section id="regressions"><h2>Largest regressions</h2>' in html
        assert all(f"<td>{r['query_id']}</td>" in html for r in expected)
    # the MLflow descriptions (the mlflow.note.content tag), read back through MLflow's API
    from mlflow.tracking import MlflowClient

    info = json.loads((sweep / "sweep.json").read_text(encoding="utf-8"))
    client = MlflowClient(tracking_uri=info["tracking_uri"])
    named = ", ".join(f"{r['query_id']} ({r['split']} {-r['drop']:+.3f})" for r in expected)
    parent = client.get_run(info["parent_run_id"]).data.tags["mlflow.note.content"]
    assert f"Largest regressions (recall@5): chunk=256: {named}" in parent.splitlines()
    runs = client.search_runs([info["experiment_id"]], f"tags.mlflow.parentRunId = '{info['parent_run_id']}'")
    (child,) = [r for r in runs if r.data.tags.get("ablation.role") == "variant"]
    first = child.data.tags["mlflow.note.content"].split("\n\n")[0]  # then a note on the traces view
    assert first.endswith(f". Largest regressions: {named}.")
