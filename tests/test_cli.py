"""The rag-ablate command line, and README coverage of commands and config groups."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rag_ablate.cli.main import build_parser, main
from rag_ablate.config.overrides import CONF_DIR
from tests.conftest import QUERIES, write_dataset

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text(encoding="utf-8")


def test_validate_sample_prints_summary(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", str(REPO / "rag_ablate" / "data" / "sample")]) == 0
    out = capsys.readouterr().out
    for word in (
        "documents",
        "answerable",
        "unanswerable",
        "intents",
        "splits",
        "groups",
        "largest groups",
        "OK",
    ):
        assert word in out


def test_validate_json(tiny_dataset: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", str(tiny_dataset), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["documents"] == 4 and data["queries"] == 8 and data["unanswerable"] == 1


def test_validate_bad_dataset_lists_problems(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    qs = [dict(q) for q in QUERIES]
    qs[1]["relevant"] = {"NOPE": 1}
    qs[3]["split"] = "train"
    folder = write_dataset(tmp_path / "bad", queries=qs)
    assert main(["validate", str(folder)]) == 1
    err = capsys.readouterr().err
    assert "2 problem(s)" in err
    assert "queries.jsonl:2: field 'relevant'" in err and "queries.jsonl:4: field 'split'" in err


def test_validate_shows_control_characters_in_dataset_text_as_escapes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An ESC sequence planted in a query or a field name is printed visibly, never acted on."""
    qs = [dict(q) for q in QUERIES]
    qs[6]["query"] = "\x1b[2J\x1b[31m" + qs[6]["query"]  # q7, shown as its group's example
    folder = write_dataset(tmp_path / "esc", queries=qs)
    assert main(["validate", str(folder)]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\\x1b[2J\\x1b[31m" in out
    qs[2]["\x1b]0;owned\x07"] = 1  # an unknown field whose name is an escape sequence
    folder = write_dataset(tmp_path / "bad", queries=qs)
    assert main(["validate", str(folder)]) == 1
    err = capsys.readouterr().err
    assert "\x1b" not in err and "\x07" not in err and "\\x1b]0;owned\\x07" in err


def test_validate_missing_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", str(tmp_path / "none")]) == 2
    assert "dataset folder not found" in capsys.readouterr().err


def test_ui_without_store(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ui", "--uri", f"sqlite:///{tmp_path / 'no.db'}"]) == 1
    assert "no MLflow store" in capsys.readouterr().err


def test_every_command_has_help_and_is_documented() -> None:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    for name, p in sub.choices.items():  # type: ignore[attr-defined]
        assert p.description or p.format_help(), name
        assert f"rag-ablate {name}" in README, f"README does not mention rag-ablate {name}"


def test_every_config_group_and_option_is_documented() -> None:
    for group in sorted(p.name for p in CONF_DIR.iterdir() if p.is_dir()):
        assert f"`{group}`" in README, f"README lacks config group {group}"
        for opt in sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml")):
            assert f"`{opt}`" in README, f"README lacks option {group}={opt}"


def test_one_line_errors_show_control_characters_as_escapes() -> None:
    """The one-line errors of failed sweep jobs and refused runs may quote dataset text."""
    from rag_ablate.core.errors import DatasetError, one_line
    from rag_ablate.core.fmt import visible

    assert one_line(DatasetError("tag '\x1b[2J\u202e'", file="q.jsonl", line=3)) == (
        "q.jsonl:3: tag '\\x1b[2J\\u202e'"
    )
    assert visible("中文 text, tabs\tand all") == "中文 text, tabs\\tand all"
