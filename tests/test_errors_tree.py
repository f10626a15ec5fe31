"""The exception tree drawn at the top of rag_ablate/core/errors.py is the package's real one.

Every module of the package is imported and every exception class defined in it is collected;
each must appear in the drawing exactly once, under its first base class, with its module named
when it is not errors.py and its other base classes named as ``also <Base>``. Exception classes
must be defined at module level, so that importing the modules finds them all.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import pkgutil
import re
from dataclasses import dataclass
from pathlib import Path

import rag_ablate
from rag_ablate.core import errors

PACKAGE = Path(rag_ablate.__file__).resolve().parent
ERRORS_MODULE = "rag_ablate.core.errors"

_LINE = re.compile(r"^(?P<indent>(?:│   |    )*)(?P<branch>├── |└── )?(?P<name>\w+)(?:\s+(?P<rest>.*))?$")


@dataclass(frozen=True)
class Drawn:
    name: str
    module: str  # dotted
    parent: str | None  # the parent's key, None for the root
    also: tuple[str, ...]  # further base classes named on the line
    last: bool  # drawn with └──


def key(module: str, name: str) -> str:
    return f"{module}.{name}"


def parse_tree(doc: str, home: str = ERRORS_MODULE) -> tuple[dict[str, Drawn], list[str]]:
    """The literal block after the first ``::`` of ``doc``: key -> Drawn, and drawing problems.

    A line's module is the ``path/to/module.py`` its text starts with, else ``home``.
    """
    lines = doc.split("::\n", 1)[1].splitlines()
    while lines and not lines[0].strip():
        lines.pop(0)
    block = []
    for line in lines:
        if not line.startswith("    "):
            break
        block.append(line[4:])
    drawn: dict[str, Drawn] = {}
    problems: list[str] = []
    path: list[str] = []  # the keys from the root down to the last line's depth
    children: dict[str | None, list[str]] = {}
    for line in block:
        m = _LINE.match(line)
        if m is None:
            problems.append(f"not a tree line: {line!r}")
            continue
        depth = len(m["indent"]) // 4 + (1 if m["branch"] else 0)
        if depth > len(path):
            problems.append(f"{m['name']}: drawn deeper than its parent")
            continue
        rest = m["rest"] or ""
        where = re.match(r"([\w/]+)\.py\b:?", rest)
        package = home.split(".")[0]
        module = f"{package}." + where[1].replace("/", ".") if where else home
        also = tuple(re.findall(r"\balso (\w+)", rest))
        parent = path[depth - 1] if depth else None
        k = key(module, m["name"])
        if k in drawn:
            problems.append(f"{k}: drawn twice")
        drawn[k] = Drawn(m["name"], module, parent, also, m["branch"] == "└── ")
        children.setdefault(parent, []).append(k)
        del path[depth:]
        path.append(k)
    for parent, kids in children.items():
        for i, k in enumerate(kids):
            if drawn[k].last != (i == len(kids) - 1) and parent is not None:
                problems.append(f"{k}: └── must mark the last child of {parent}, and only it")
    return drawn, problems


def _import_all() -> None:
    for info in pkgutil.walk_packages([str(PACKAGE)], prefix="rag_ablate."):
        if info.name != "rag_ablate.__main__":  # __main__ would run the command line
            importlib.import_module(info.name)


def exception_classes(package: str = "rag_ablate") -> list[type[BaseException]]:
    """Every exception class defined in a module of the package (imports every module)."""
    _import_all()
    seen: list[type[BaseException]] = []
    todo: list[type[BaseException]] = [BaseException]
    while todo:
        cls = todo.pop()
        for sub in cls.__subclasses__():
            if sub not in seen:
                todo.append(sub)
                if sub.__module__.split(".")[0] == package:
                    seen.append(sub)
    return sorted(seen, key=lambda c: (c.__module__, c.__qualname__))


def check(drawn: dict[str, Drawn], classes: list[type[BaseException]]) -> list[str]:
    """What the drawing gets wrong about ``classes`` (empty when it is right)."""
    problems = []
    actual = {key(c.__module__, c.__qualname__): c for c in classes}
    for k, cls in actual.items():
        d = drawn.get(k)
        if d is None:
            problems.append(f"{k} is not in the tree")
            continue
        first, *others = cls.__bases__
        parent = key(first.__module__, first.__qualname__) if first in actual.values() else first.__name__
        # a parent from outside the package (Exception, KeyError) is drawn by its bare name
        drawn_parent = d.parent if d.parent is None or d.parent in actual else drawn[d.parent].name
        if drawn_parent != parent:
            problems.append(f"{k} is drawn under {drawn_parent}, its parent is {parent}")
        if sorted(d.also) != sorted(b.__name__ for b in others):
            problems.append(f"{k}: the line names 'also {list(d.also)}', its other bases are {others}")
    for k, d in drawn.items():
        if k not in actual and d.parent is not None:
            problems.append(f"{k} is drawn but no module of the package defines it")
    roots = [d for d in drawn.values() if d.parent is None]
    if [r.name for r in roots] != ["Exception"]:
        problems.append(f"the tree must have one root, Exception; it has {[r.name for r in roots]}")
    return problems


def test_every_exception_class_of_the_package_is_drawn_under_its_parent() -> None:
    doc = errors.__doc__ or ""
    drawn, problems = parse_tree(doc)
    assert problems == []
    classes = exception_classes()
    assert check(drawn, classes) == []
    # the tree is not trivially empty: the base, the errors users see and the internal ones
    names = {c.__name__ for c in classes}
    assert {"RagAblateError", "DatasetValidationError", "RecordsError", "_Failure"} <= names


def test_exception_classes_are_defined_at_module_level() -> None:
    """A class defined inside a function would escape the import walk above."""
    builtin_errors = {
        n for n, v in vars(builtins).items() if isinstance(v, type) and issubclass(v, BaseException)
    }
    package_errors = {c.__name__ for c in exception_classes()}
    nested = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        top = set(tree.body)
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and node not in top:
                bases = {ast.unparse(b).rpartition(".")[2] for b in node.bases}
                if bases & (builtin_errors | package_errors) or any(b.endswith("Error") for b in bases):
                    nested.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: {node.name}")
    assert nested == []


def test_the_check_finds_a_missing_class_a_wrong_parent_and_a_stale_entry() -> None:
    # the checker on a drawing of its own, against classes of a made-up package: it must see all three
    home = "fakepkg.errors"
    doc = (
        "Tree::\n\n"
        "    Exception\n"
        "    ├── Base\n"
        "    │   └── Gone         mod/x.py: no longer defined\n"
        "    └── Child            also KeyError: drawn under the wrong parent\n"
    )
    drawn, problems = parse_tree(doc, home)
    assert problems == []
    assert drawn[key("fakepkg.mod.x", "Gone")].parent == key(home, "Base")
    assert drawn[key(home, "Child")].also == ("KeyError",)

    base = type("Base", (Exception,), {"__module__": home})
    child = type("Child", (base, KeyError), {"__module__": home})
    missing = type("Missing", (base,), {"__module__": home})
    assert check(drawn, [base, child, missing]) == [
        f"{home}.Child is drawn under Exception, its parent is {home}.Base",
        f"{home}.Missing is not in the tree",
        "fakepkg.mod.x.Gone is drawn but no module of the package defines it",
    ]
    assert check(drawn, [base, type("Child", (Exception,), {"__module__": home})]) == [
        f"{home}.Child: the line names 'also ['KeyError']', its other bases are []",
        "fakepkg.mod.x.Gone is drawn but no module of the package defines it",
    ]
    bad_branch = "T::\n\n    Exception\n    └── A\n    └── B\n"
    assert parse_tree(bad_branch, home)[1] == [
        f"{home}.A: └── must mark the last child of {home}.Exception, and only it"
    ]
