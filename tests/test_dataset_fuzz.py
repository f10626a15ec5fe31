"""Fuzzing the dataset files: every broken file ends in the project's own error, never a traceback.

Hypothesis mutates a valid dataset (tests/conftest.py's tiny one) the ways files break in the wild:
broken JSON, wrong types, missing or unknown fields, unknown doc ids, bad offsets, duplicate ids,
non-UTF-8 bytes, empty files, huge lines, deep nesting, numbers too long to convert. The loader must
either accept the files (a valid mutation) or raise :class:`~rag_ablate.core.errors.DatasetError` naming the
file (and the line and field when there is one); nothing is partially loaded (it returns a whole
dataset or raises). A byte-order mark and CRLF line ends are valid and load the same dataset.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from conftest import DOCS, QUERIES, write_dataset
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rag_ablate.core.errors import DatasetError
from rag_ablate.dataset.load import load_dataset
from rag_ablate.dataset.model import CORPUS_FILE, QUERIES_FILE

FILES = (CORPUS_FILE, QUERIES_FILE)

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(10**12), 10**12)
    | st.floats(allow_nan=True)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6,
)


def _lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").split("\n")[:-1]


def _write_lines(path: Path, lines: list[str]) -> None:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")


@st.composite
def mutations(draw: st.DrawFn) -> tuple[str, str, Any]:
    """(file, kind, argument) of one way to break (or harmlessly change) a dataset file."""
    file = draw(st.sampled_from(FILES))
    kind = draw(
        st.sampled_from(
            [
                "set_field",
                "drop_field",
                "garbage_line",
                "truncate_line",
                "duplicate_line",
                "bad_bytes",
                "empty_file",
                "huge_line",
                "deep_nesting",
                "long_number",
                "not_an_object",
                "bad_offsets",
                "unknown_doc",
            ]
        )
    )
    rows = DOCS if file == CORPUS_FILE else QUERIES
    index = draw(st.integers(0, len(rows) - 1))
    if kind == "set_field":
        key = draw(st.sampled_from(sorted({k for r in rows for k in r} | {"extra"})))
        return file, kind, (index, key, draw(json_values))
    if kind == "drop_field":
        key = draw(st.sampled_from(sorted(rows[index])))
        return file, kind, (index, key)
    if kind == "garbage_line":
        # a line of whitespace only is a blank line, which the format allows, not garbage
        garbage = st.text(min_size=1, max_size=40).filter(lambda t: t.replace("\n", " ").strip())
        return file, kind, (index, draw(garbage))
    if kind == "truncate_line":
        return file, kind, (index, draw(st.integers(1, 30)))
    if kind == "bad_bytes":
        return file, kind, (index, draw(st.binary(min_size=1, max_size=4).filter(_not_utf8)))
    if kind == "bad_offsets":
        start = draw(st.integers(-5, 400))
        return QUERIES_FILE, kind, (draw(st.integers(0, len(QUERIES) - 1)), start, draw(st.integers(-5, 400)))
    return file, kind, index


def _not_utf8(b: bytes) -> bool:
    try:
        b.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


def _apply(folder: Path, file: str, kind: str, arg: Any) -> None:
    path = folder / file
    lines = _lines(path)
    if kind == "set_field":
        i, key, value = arg
        row = json.loads(lines[i])
        row[key] = value
        lines[i] = json.dumps(row, ensure_ascii=False)
    elif kind == "drop_field":
        i, key = arg
        row = json.loads(lines[i])
        row.pop(key, None)
        lines[i] = json.dumps(row, ensure_ascii=False)
    elif kind == "garbage_line":
        i, text = arg
        lines[i] = text.replace("\n", " ")
    elif kind == "truncate_line":
        i, cut = arg
        lines[i] = lines[i][:-cut]
    elif kind == "duplicate_line":
        lines.append(lines[arg])
    elif kind == "bad_bytes":
        i, raw = arg
        data = "".join(line + "\n" for line in lines).encode("utf-8")
        at = sum(len(line.encode("utf-8")) + 1 for line in lines[:i]) + 5
        path.write_bytes(data[:at] + raw + data[at:])
        return
    elif kind == "empty_file":
        path.write_bytes(b"")
        return
    elif kind == "huge_line":  # a valid row with a 2 MB text: accepted
        row = json.loads(lines[arg])
        field = "text" if file == CORPUS_FILE else "query"
        row[field] = row[field] + " word" * 400_000
        lines[arg] = json.dumps(row, ensure_ascii=False)
    elif kind == "deep_nesting":
        lines[arg] = "[" * 100_000 + "]" * 100_000
    elif kind == "long_number":
        row = json.loads(lines[arg])
        lines[arg] = json.dumps(row)[:-1] + ', "n": ' + "9" * 5000 + "}"
    elif kind == "not_an_object":
        lines[arg] = json.dumps([json.loads(lines[arg])])
    elif kind == "bad_offsets":
        i, start, end = arg
        row = json.loads(lines[i])
        if row.get("evidence"):
            row["evidence"][0]["start"], row["evidence"][0]["end"] = start, end
        lines[i] = json.dumps(row, ensure_ascii=False)
    elif kind == "unknown_doc":
        row = json.loads(lines[arg])
        if file == QUERIES_FILE:
            row["relevant"] = {"NO_SUCH_DOC": 1}
        else:
            row["doc_id"] = ""
        lines[arg] = json.dumps(row, ensure_ascii=False)
    _write_lines(path, lines)


@pytest.mark.slow
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(mutation=mutations())
def test_a_broken_file_is_refused_with_file_line_and_field_never_a_traceback(
    tmp_path_factory: pytest.TempPathFactory, mutation: tuple[str, str, Any]
) -> None:
    file, kind, arg = mutation
    folder = write_dataset(
        tmp_path_factory.mktemp("fuzz"), docs=copy.deepcopy(DOCS), queries=copy.deepcopy(QUERIES)
    )
    _apply(folder, file, kind, arg)
    try:
        ds = load_dataset(folder)
    except DatasetError as exc:
        assert exc.file is not None
        assert str(exc).startswith(exc.file)
        text = str(exc)
        assert "Traceback" not in text
        if kind in {
            "garbage_line",
            "truncate_line",
            "bad_bytes",
            "deep_nesting",
            "long_number",
            "not_an_object",
        }:
            assert exc.line is not None  # a line-level problem names its line
        if kind in {"set_field", "drop_field"} and exc.field is not None:
            assert exc.line is not None
        return
    except Exception as exc:  # anything else is a defect
        pytest.fail(f"{kind} on {file} ({arg!r:.200}) raised {type(exc).__name__}: {exc}")
    # accepted: the whole dataset, never a part of it
    assert kind not in {
        "garbage_line",
        "bad_bytes",
        "empty_file",
        "deep_nesting",
        "long_number",
        "not_an_object",
    }
    assert len(ds.documents) == len(DOCS) and len(ds.queries) == len(QUERIES)


@pytest.mark.parametrize("variant", ["bom", "crlf", "bom+crlf"])
def test_byte_order_mark_and_crlf_load_the_same_dataset(tmp_path: Path, variant: str) -> None:
    plain = load_dataset(write_dataset(tmp_path / "plain"))
    folder = write_dataset(tmp_path / variant)
    for file in FILES:
        data = (folder / file).read_bytes()
        if "crlf" in variant:
            data = data.replace(b"\n", b"\r\n")
        if "bom" in variant:
            data = b"\xef\xbb\xbf" + data
        (folder / file).write_bytes(data)
    ds = load_dataset(folder)
    assert ds.documents == plain.documents
    assert ds.queries == plain.queries
    assert ds.corpus_fingerprint == plain.corpus_fingerprint


def test_a_line_separator_inside_a_json_string_is_not_a_line_end(tmp_path: Path) -> None:
    docs = copy.deepcopy(DOCS)
    docs[0]["title"] = "Return\u2028policy\x0cpage"  # valid JSON strings that str.splitlines() would cut
    ds = load_dataset(write_dataset(tmp_path / "d", docs=docs))
    assert ds.documents["RET"].title == "Return\u2028policy\x0cpage"


@pytest.mark.parametrize(
    ("content", "line", "reason"),
    [
        (b'{"doc_id": "A", "text": "x"}\n{"doc_id": "A", "text": "y"}\n', 2, "duplicate"),
        (b'{"doc_id": "A", "text": "x"}\n\xff\xfe\n', 2, "not valid UTF-8"),
        (b'{"doc_id": "A", "text": "x"}\n{"doc_id": "B", "text": 5}\n', 2, "must be a string"),
        (b'{"doc_id": "A", "text": "x"}\n' + b"[" * 50_000 + b"\n", 2, "invalid JSON"),
    ],
)
def test_corpus_errors_name_their_line(tmp_path: Path, content: bytes, line: int, reason: str) -> None:
    folder = write_dataset(tmp_path / "d")
    (folder / CORPUS_FILE).write_bytes(content)
    with pytest.raises(DatasetError) as info:
        load_dataset(folder)
    errors = getattr(info.value, "errors", [info.value])
    hit = [e for e in errors if e.file == CORPUS_FILE and e.line == line]
    assert hit and reason in " ".join(str(e) for e in hit), [str(e) for e in errors]
