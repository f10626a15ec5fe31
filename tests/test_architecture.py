"""The floor plan holds: every module imports only from its own layer's package or from layers below,
and no import cycle exists, counting imports inside functions and under ``TYPE_CHECKING``.

The layers, bottom up, are :data:`LAYERS` (docs/architecture.md draws them). A module's layer is its
first package under ``rag_ablate`` (``rag_ablate.settings`` and ``rag_ablate.__main__`` are layers of
their own). Within one package, imports may go either way but must not form a cycle.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "rag_ablate"

# bottom up; a module may import from its own entry or any entry before it
LAYERS = (
    "core",
    "text",
    "config",
    "dataset",
    "metrics",
    "pipeline",
    "llm",
    "records",
    "generators",
    "tracking",
    "systems",
    "judges",
    "run",
    "compare",
    "report",
    "settings",
    "sweep",
    "cli",
)


def modules() -> dict[str, Path]:
    out = {}
    for p in sorted(PACKAGE.rglob("*.py")):
        rel = p.relative_to(PACKAGE.parent).with_suffix("")
        out[".".join(rel.parts).removesuffix(".__init__")] = p
    return out


def layer_of(module: str) -> int:
    parts = module.split(".")
    if len(parts) == 1:  # rag_ablate/__init__.py: the version, nothing else
        return 0
    if parts[1] == "__main__":
        return len(LAYERS) - 1
    return LAYERS.index(parts[1])


def imports(mods: dict[str, Path]) -> dict[str, dict[str, int]]:
    """module -> {imported module: line}, every import statement anywhere in the file."""
    out: dict[str, dict[str, int]] = {}
    for m, p in mods.items():
        pkg = m if p.name == "__init__.py" else m.rpartition(".")[0]
        found: dict[str, int] = {}
        for n in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if isinstance(n, ast.ImportFrom):
                base = n.module or ""
                if n.level:
                    parts = pkg.split(".")
                    base = ".".join(parts[: len(parts) - n.level + 1] + ([base] if base else []))
                names = [f"{base}.{a.name}" for a in n.names] + [base]
            elif isinstance(n, ast.Import):
                names = [a.name for a in n.names]
            else:
                continue
            for t in names:
                while t and t not in mods:
                    t = t.rpartition(".")[0]
                if t and t != m:
                    found.setdefault(t, n.lineno)
        out[m] = found
    return out


def cycles(edges: dict[str, dict[str, int]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    for root in edges:
        if root in index:
            continue
        work = [(root, iter(edges[root]))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(edges[w])))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
    return out


def upward(mods: dict[str, Path], edges: dict[str, dict[str, int]]) -> list[str]:
    bad = []
    for m, targets in edges.items():
        for t, line in targets.items():
            if layer_of(t) > layer_of(m):
                where = mods[m].relative_to(PACKAGE.parent)
                bad.append(f"{where}:{line}: {m} ({LAYERS[layer_of(m)]}) imports {t} ({LAYERS[layer_of(t)]})")
    return sorted(bad)


def test_every_module_is_in_a_layer() -> None:
    mods = modules()
    top = {m.split(".")[1] for m in mods if m.count(".") >= 1}
    assert top - set(LAYERS) - {"__main__", "data"} == set(), "add new top-level packages to LAYERS"


def test_no_import_points_up_a_layer() -> None:
    mods = modules()
    bad = upward(mods, imports(mods))
    assert bad == [], "imports that point up a layer:\n" + "\n".join(bad)


def test_no_import_cycle() -> None:
    mods = modules()
    found = cycles(imports(mods))
    assert found == [], "import cycles:\n" + "\n".join(" ".join(c) for c in found)


def test_the_checker_sees_function_level_and_type_checking_imports(tmp_path: Path) -> None:
    # the checks above are only as good as the import finder: it must see all three kinds
    src = (
        "from typing import TYPE_CHECKING\n"
        "from rag_ablate.core import errors\n"
        "if TYPE_CHECKING:\n    from rag_ablate.run import runner\n"
        "def f():\n    from rag_ablate.cli import main\n"
    )
    fake = {"rag_ablate.core.x": tmp_path / "x.py", "rag_ablate.core.errors": tmp_path / "e.py",
            "rag_ablate.run.runner": tmp_path / "r.py", "rag_ablate.cli.main": tmp_path / "m.py"}
    for p in fake.values():
        p.write_text("")
    fake["rag_ablate.core.x"].write_text(src)
    edges = imports(fake)
    seen = set(edges["rag_ablate.core.x"])
    assert seen == {"rag_ablate.core.errors", "rag_ablate.run.runner", "rag_ablate.cli.main"}
    assert cycles({"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1}, "d": {"a": 1}}) == [["a", "b", "c"]]


def test_layer_counts_are_reported() -> None:
    # one line per layer with its module count: documentation for docs/architecture.md
    per = defaultdict(int)
    for m in modules():
        per[LAYERS[layer_of(m)]] += 1
    assert all(per[name] > 0 for name in LAYERS)


# MLflow writers of tracking/store.py and tracking/traces.py, and who may call them: the job's start
# (its run, RUNNING) and end (run/runner.py, _start_run and _log_job), the sweep's start, end and
# interruption (sweep/driver.py, sweep/publish.py), resume= and its orphans (run/resume.py)
WRITERS = {
    "log_run", "log_metrics", "log_artifacts", "log_table", "log_trace_set", "log_dataset_input",
    "set_description", "append_description", "set_tags", "save_view", "finish_run", "end_run", "start_run",
    "start_parent", "reopen_run",
}  # fmt: skip
WRITES_MLFLOW = {
    "rag_ablate.run.runner": {"_log_job", "_start_run", "_log_traces", "_log_to_mlflow"},
    "rag_ablate.run.resume": None,  # reopening and ending the runs of an interrupted sweep
    "rag_ablate.sweep.driver": {"_start_sweep", "finish_sweep", "_finish_sweep", "interrupt_sweep"},
    "rag_ablate.sweep.publish": None,
}


def test_mlflow_is_written_from_one_place_per_step() -> None:
    """Analysis and rendering return values; only the job's and the sweep's drivers log them."""
    found: dict[str, set[str]] = defaultdict(set)
    for m, p in modules().items():
        if m.startswith("rag_ablate.tracking."):
            continue
        tree = ast.parse(p.read_text(encoding="utf-8"))
        for fn in ast.walk(tree):
            if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for n in ast.walk(fn):
                if (
                    isinstance(n, ast.Call)
                    and isinstance(n.func, ast.Attribute)
                    and n.func.attr in WRITERS
                    and isinstance(n.func.value, ast.Name)
                    and n.func.value.id in ("tracking", "mlflow_traces")
                ):
                    found[m].add(fn.name)
    assert set(found) == set(WRITES_MLFLOW), f"modules writing MLflow: {sorted(found)}"
    for m, allowed in WRITES_MLFLOW.items():
        if allowed is not None:
            assert found[m] <= allowed, f"{m} writes MLflow from {sorted(found[m] - allowed)}"
