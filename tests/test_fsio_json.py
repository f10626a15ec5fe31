"""write_json_atomic's indented text from larger pieces: the json module's text, byte for byte."""

from __future__ import annotations

import enum
import json
from pathlib import Path
from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

from rag_ablate.core import fsio
from rag_ablate.core.fsio import indented_pieces, write_json_atomic


class _Level(enum.IntEnum):  # an int subclass: not a plain scalar, written by the json module's encoder
    LOW = 1


_SCALAR = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text()
    | st.sampled_from(["a\nb", '"q"', "中文", "\u2028", "\\"])
    | st.just(_Level.LOW)
)
_JSON = st.recursive(
    _SCALAR,
    lambda inner: (
        st.lists(inner, max_size=5)
        | st.lists(inner, max_size=3).map(tuple)
        | st.dictionaries(st.text(max_size=4), inner, max_size=5)
        # keys the encoder converts to strings
        | st.dictionaries(st.integers(-3, 3) | st.none() | st.booleans(), inner, max_size=3)
    ),
    max_leaves=40,
)


@settings(max_examples=400, deadline=None)
@given(data=_JSON, indent=st.sampled_from([0, 1, 2]))
@example(data={"m": {"a": 1.0, "b": float("nan")}, "n": {"dev": {"x": 3}}, "e": {}, "l": []}, indent=1)
@example(data=[{"k": [1, [2, {"z": None}]]}, {1: "int key"}, (True, -0.0)], indent=1)
def test_indented_pieces_are_the_json_modules_text(data: Any, indent: int) -> None:
    encoder = json.JSONEncoder(ensure_ascii=False, indent=indent)
    expected = json.dumps(data, ensure_ascii=False, indent=indent)
    assert "".join(indented_pieces(data, indent, 0, encoder)) == expected
    whole, fsio._FLAT_ITEMS = fsio._FLAT_ITEMS, 2  # a flat dict or list encoded two items at a time
    try:
        assert "".join(indented_pieces(data, indent, 0, encoder)) == expected
    finally:
        fsio._FLAT_ITEMS = whole


def test_write_json_atomic_writes_the_json_modules_bytes(tmp_path: Path) -> None:
    metrics = {"all/recall_at_5": 0.25, "all/n": 3.0}
    data = {"slices": [{"kind": "tag", "metrics": metrics, "n": {"all": {"x": 1}}, "name": "中文"}]}
    write_json_atomic(tmp_path / "a.json", data)
    assert (tmp_path / "a.json").read_text("utf-8") == json.dumps(data, ensure_ascii=False, indent=1)
    many = {"values": [i / 7 for i in range(10_000)], "by": {str(i): i for i in range(9_000)}}  # chunks
    write_json_atomic(tmp_path / "m.json", many)
    assert (tmp_path / "m.json").read_text("utf-8") == json.dumps(many, ensure_ascii=False, indent=1)
    write_json_atomic(tmp_path / "b.json", {"b": 1, "a": [2]}, sort_keys=True)  # options: the json module's
    assert (tmp_path / "b.json").read_text() == json.dumps({"a": [2], "b": 1}, indent=1, sort_keys=True)
