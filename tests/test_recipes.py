"""Each recipe of docs/architecture.md "Extending rag_ablate" works with exactly the files it names.

A test per recipe copies the package, conf/, README.md and docs/ into a temporary folder, follows
the recipe there literally (writes the new module, edits the files the recipe names, nothing
else), checks that the files it touched are exactly the recipe's list, and then uses the new
extension through the real entry points of the copy: a run of the embedded sample with
``retrieval=<new>``, ``rerank=<new>`` or ``system=<new>``, or ``rag-ablate import <new>`` followed
by ``rag-ablate validate``. The registry checks of tests/test_registry.py (a config file per
name, a mention in README or docs/) are applied to the copy as well, so a recipe that forgot a
file fails here. The file count of each recipe is read from the doc, so the doc and the tests
cannot drift apart.
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
    "comparison or report section": 7,
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
        '"rag_ablate.systems.http")',
        '"rag_ablate.systems.http", "rag_ablate.systems.first_doc")',
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


def test_how_to_add_a_comparison_or_report_section() -> None:
    # The recipe names a field of the typed Comparison and one renderer per view; report.html and the
    # MLflow descriptions render from the typed Comparison only after the lead's pending rework of the
    # comparison shape, so there is nothing yet to follow end to end.
    from rag_ablate.report import html

    if "Mapping[str, Any]" in str(html._comparison_section.__annotations__.get("comp", "")):
        pytest.skip(
            "pending: the lead's rework of the comparison shape (report/html.py still renders "
            "comparison.json's dict, not the typed Comparison of compare/model.py)"
        )
    pytest.fail(
        "report/html.py renders the typed Comparison now: follow 'How to add a comparison or report "
        "section' here end to end (a field on Comparison, computed in compare/, shown by every renderer)"
    )
