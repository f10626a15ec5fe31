"""Terminal tables line up whatever script their cells are written in."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from rag_ablate.core.fmt import display_width, format_table


def test_display_width_counts_terminal_columns() -> None:
    assert display_width("recall") == 6
    assert display_width("召回率") == 6  # wide characters take two columns
    assert display_width("ＡＢ，") == 6  # full-width Latin letters and punctuation too
    assert display_width("e\u0301") == 1  # a combining accent takes none
    assert display_width("a\u200bb") == 2  # nor does a zero-width space


def _cell_columns(line: str, cells: list[str]) -> list[int]:
    """The terminal column at which each cell starts in a rendered line."""
    cols, at = [], 0
    for cell in cells:
        at = line.index(cell, at)
        cols.append(display_width(line[:at]))
        at += len(cell)
    return cols


_LETTERS = list("abcxyz019=._") + list("召回率检索意图ＡＢ１")
_cell = st.text(alphabet=st.sampled_from(_LETTERS), min_size=1, max_size=8)


@given(st.lists(st.lists(_cell, min_size=3, max_size=3), min_size=1, max_size=5))
def test_cells_start_at_the_same_column_on_every_line(rows: list[list[str]]) -> None:
    headers = ["variant", "意图", "recall@5"]
    lines = format_table(headers, rows).splitlines()
    expected = _cell_columns(lines[0], headers)
    assert all(_cell_columns(line, row) == expected for line, row in zip(lines[2:], rows, strict=True)), lines
    assert len({display_width(line) for line in lines}) == 1, lines  # the rule under the header spans it all


def test_a_chinese_table_is_aligned_as_a_person_sees_it() -> None:
    rows = [["chunk=256", "退货退款", "0.812"], ["检索=混合", "refund", "0.790"]]
    lines = format_table(["variant", "意图", "recall@5"], rows).splitlines()
    # "退货退款" takes 8 columns, so the third column starts at 9 + 2 + 8 + 2 = 21 on every line
    assert [_cell_columns(line, row)[2] for line, row in zip(lines[2:], rows, strict=True)] == [21, 21]


def test_a_table_without_rows_is_its_header() -> None:
    assert format_table(["variant", "召回"], []).splitlines() == ["variant  召回", "-------  ----"]
