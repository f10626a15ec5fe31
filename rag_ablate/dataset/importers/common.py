"""What every import format shares: the import report, the importer registry, and
the driver that writes, groups, splits, validates and moves a dataset into place.

A format is a subclass of :class:`Importer` in its own module, registered with
``@IMPORTERS.register("name")``; its :meth:`Importer.read` writes the documents and
returns the questions as :class:`Case` objects. Everything after that is here:
near-duplicate groups and splits, ``queries.jsonl``, validation with
:func:`rag_ablate.dataset.load.load_dataset`, the atomic move into the output folder and
the :class:`ImportReport`. See docs/dataset-format.md for the contract written.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, ClassVar

from rag_ablate.core.errors import ConfigError, DatasetError, UnknownNameError
from rag_ablate.core.registry import Registry
from rag_ablate.dataset.grouping.groups import group_near_duplicates
from rag_ablate.dataset.grouping.splits import assign_splits
from rag_ablate.dataset.load import load_dataset
from rag_ablate.dataset.model import CORPUS_FILE, INTENTS_FILE, QUERIES_FILE, SPLITS

_SURROGATE = re.compile("[\ud800-\udfff]")
_SHOWN = 10


# --------------------------------------------------------------------------- report


@dataclass
class ImportReport:
    """What an import did: counts, and every item that could not be mapped, with why."""

    format: str
    source: str
    out_dir: str
    documents: int
    queries: int
    answerable: int
    unanswerable: int
    skipped: list[tuple[str, str]]
    relocated_spans: int
    groups_multi: int
    splits: dict[str, int]
    notes: list[tuple[str, str]] = field(default_factory=list)
    """Things that were mapped, but not 1:1 (renamed ids, moved groups...)."""
    mapped: dict[str, int] = field(default_factory=dict)
    """How many questions were mapped from each non-canonical variant of the format
    (e.g. ``is_impossible`` given as a string), by a readable name of the variant."""

    def summary(self) -> str:
        lines = [
            f"imported {self.format} from {self.source} into {self.out_dir}",
            f"  {self.documents} documents, {self.queries} queries "
            f"({self.answerable} answerable, {self.unanswerable} unanswerable)",
            "  splits: "
            + ", ".join(f"{s} {n}" for s, n in self.splits.items())
            + f"; near-duplicate groups with more than one query: {self.groups_multi}",
            f"  answer spans relocated by string search: {self.relocated_spans}",
        ]
        if self.mapped:
            lines.append("  variants mapped (questions per variant; one can count under several):")
            lines.extend(f"    - {what}: {n}" for what, n in self.mapped.items())
        if self.skipped:
            by_kind = Counter(reason.split(":", 1)[0] for _, reason in self.skipped)
            lines.append(
                f"  skipped or dropped {len(self.skipped)} item(s): "
                + "; ".join(f"{n} x {kind}" for kind, n in by_kind.most_common())
            )
            lines.extend(f"    - {item}: {reason}" for item, reason in self.skipped[:_SHOWN])
            if len(self.skipped) > _SHOWN:
                lines.append(f"    ... and {len(self.skipped) - _SHOWN} more")
        else:
            lines.append("  nothing skipped")
        if self.notes:
            lines.append(f"  notes ({len(self.notes)}):")
            lines.extend(f"    - {item}: {note}" for item, note in self.notes[:_SHOWN])
            if len(self.notes) > _SHOWN:
                lines.append(f"    ... and {len(self.notes) - _SHOWN} more")
        return "\n".join(lines)


# --------------------------------------------------------------------------- what a format returns


@dataclass
class Case:
    """One question as a format maps it; becomes one line of ``queries.jsonl``."""

    query_id: str
    query: str
    relevant: dict[str, int]
    evidence: list[tuple[str, int, int]]
    references: list[str]
    tags: list[str]
    fixed_split: str | None = None
    nonrelevant: tuple[str, ...] = ()  # doc ids judged not relevant (qrels grade <= 0)
    human_judgements: list[dict[str, Any]] = field(default_factory=list)  # written as given
    metadata: dict[str, Any] = field(default_factory=dict)  # the query's free metadata object

    @property
    def answerable(self) -> bool:
        return bool(self.relevant)


@dataclass
class ImportRun:
    """Accumulates the outcome of one import (filled by the format's ``read``)."""

    skipped: list[tuple[str, str]] = field(default_factory=list)
    notes: list[tuple[str, str]] = field(default_factory=list)
    mapped: Counter[str] = field(default_factory=Counter)
    relocated: int = 0
    documents: int = 0
    surrogates: int = 0

    def skip(self, item: str, kind: str, detail: str | None = None) -> None:
        self.skipped.append((item, kind if detail is None else f"{kind}: {detail}"))

    def note(self, item: str, text: str) -> None:
        self.notes.append((item, text))

    def count(self, variant: str) -> None:
        """One more question mapped from the non-canonical ``variant``."""
        self.mapped[variant] += 1


class JsonlWriter:
    """Writes one JSON object a line, UTF-8, ``\\n`` line ends.

    Lone surrogates (from ``"\\ud800"`` escapes in the source) cannot be encoded as
    UTF-8; they are replaced by U+FFFD, which keeps every character offset valid.
    """

    def __init__(self, fh: BinaryIO, run: ImportRun) -> None:
        self.fh = fh
        self.run = run
        self.count = 0

    def write(self, obj: dict[str, Any]) -> None:
        line = json.dumps(obj, ensure_ascii=False)
        try:
            data = line.encode("utf-8")
        except UnicodeEncodeError:
            self.run.surrogates += len(_SURROGATE.findall(line))
            data = _SURROGATE.sub("\ufffd", line).encode("utf-8")
        self.fh.write(data + b"\n")
        self.count += 1


class Importer(ABC):
    """One source format.

    A format is a subclass in its own module, decorated with
    ``@IMPORTERS.register("name")`` and listed in the registry's ``providers``. It
    sets ``summary`` (one line for ``rag-ablate import --help``), ``doc_units`` when
    it understands more than ``context``, and implements :meth:`read`.
    """

    summary: ClassVar[str] = ""
    doc_units: ClassVar[tuple[str, ...]] = ("context",)
    """The ``doc_unit`` values this format understands; the first is the default."""

    @abstractmethod
    def read(self, source: Path, out: JsonlWriter, run: ImportRun, *, doc_unit: str) -> list[Case]:
        """Write every document to ``out`` (set ``run.documents``) and return the questions.

        Report whatever cannot be mapped with ``run.skip`` and every non-canonical
        variant mapped with ``run.count``; raise :class:`DatasetError` (naming file
        and field) for input that cannot be read at all.
        """


IMPORTERS: Registry[type[Importer]] = Registry(
    "importer",
    providers=(
        "rag_ablate.dataset.importers.squad",
        "rag_ablate.dataset.importers.beir",
        "rag_ablate.dataset.importers.clapnq",
        "rag_ablate.dataset.importers.ragchecker_meta",
    ),
)


def doc_units() -> tuple[str, ...]:
    """Every ``doc_unit`` some registered format understands."""
    return tuple(dict.fromkeys(u for name in IMPORTERS.names() for u in IMPORTERS.get(name).doc_units))


# --------------------------------------------------------------------------- helpers for formats


def doc_record(doc_id: str, text: str, title: str | None, metadata: dict[str, Any]) -> dict[str, Any]:
    rec: dict[str, Any] = {"doc_id": doc_id}
    if title:
        rec["title"] = title
    rec["text"] = text
    if metadata:
        rec["metadata"] = metadata
    return rec


def nonempty_str(value: object) -> str | None:
    """``value`` as a string when it is a non-blank string or a number, else None."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int | float):
        value = str(value)
    if isinstance(value, str) and value.strip():
        return value
    return None


def unique_id(candidate: str, taken: set[str]) -> str:
    name, k = candidate, 1
    while name in taken:
        k += 1
        name = f"{candidate}~{k}"
    taken.add(name)
    return name


def short(text: str, limit: int = 60) -> str:
    text = " ".join(text.split())
    return repr(text if len(text) <= limit else text[: limit - 3] + "...")


def dedupe(items: list[str]) -> list[str]:
    return list(dict.fromkeys(items))


def read_json(path: Path) -> Any:
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise DatasetError(f"cannot read file: {exc.strerror}", file=str(path)) from exc
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise DatasetError("not valid UTF-8", file=str(path), line=line) from exc
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise DatasetError(f"invalid JSON: {exc.msg}", file=str(path), line=exc.lineno) from exc


def iter_jsonl(path: Path, run: ImportRun, label: str) -> Iterator[tuple[int, dict[str, Any]]]:
    """Objects of a JSON Lines file; bad lines are reported as ``label:line`` and skipped."""
    try:
        fh = path.open("rb")
    except OSError as exc:
        raise DatasetError(f"cannot read file: {exc.strerror}", file=str(path)) from exc
    with fh:
        for lineno, raw in enumerate(fh, start=1):
            try:
                text = raw.decode("utf-8-sig" if lineno == 1 else "utf-8")
            except UnicodeDecodeError:
                run.skip(f"{label}:{lineno}", "line skipped", "not valid UTF-8")
                continue
            if not text.strip():
                continue
            try:
                obj = json.loads(text)
            except json.JSONDecodeError as exc:
                run.skip(f"{label}:{lineno}", "line skipped", f"invalid JSON ({exc.msg})")
                continue
            if not isinstance(obj, dict):
                run.skip(f"{label}:{lineno}", "line skipped", "not a JSON object")
                continue
            yield lineno, obj


# --------------------------------------------------------------------------- groups, splits, queries.jsonl


def _groups_and_splits(
    cases: list[Case], holdout_share: float, seed: int, run: ImportRun
) -> tuple[list[str | None], list[str], int]:
    result = group_near_duplicates([c.query for c in cases], ids=[c.query_id for c in cases], seed=seed)
    group_of = result.group_of
    fixed: list[str | None] = [c.fixed_split for c in cases]
    if any(s is not None for s in fixed):
        members: dict[str, list[int]] = {}
        for i, g in enumerate(group_of):
            members.setdefault(g, []).append(i)
        for g, idx in members.items():
            votes: Counter[str] = Counter()
            for i in idx:
                split = fixed[i]
                if split is not None:
                    votes[split] += 1
            if len(votes) < 2:
                continue
            top = votes.most_common()
            target = top[0][0] if top[0][1] > top[1][1] else fixed[idx[0]]
            moved = [cases[i].query_id for i in idx if fixed[i] not in (None, target)]
            for i in idx:
                fixed[i] = target
            run.note(
                g,
                f"near-duplicate group spans dev and holdout ({dict(sorted(votes.items()))}); "
                f"moved to {target}: {', '.join(moved)}",
            )
    splits = assign_splits(group_of, holdout_share=holdout_share, seed=seed, fixed=fixed)
    explicit = [g if result.sizes[g] > 1 else None for g in group_of]
    multi = sum(1 for n in result.sizes.values() if n > 1)
    return explicit, splits, multi


def _evidence_texts(corpus: Path, cases: list[Case]) -> dict[str, str]:
    """The written text of every document some evidence span points into (read back from ``corpus``,
    so a quote is exactly what the corpus holds, after any character replacement on writing)."""
    wanted = {doc_id for case in cases for doc_id, _, _ in case.evidence}
    texts: dict[str, str] = {}
    if not wanted:
        return texts
    with corpus.open(encoding="utf-8", newline="") as fh:
        for line in fh:
            doc = json.loads(line)
            if doc["doc_id"] in wanted:
                texts[doc["doc_id"]] = doc["text"]
    return texts


def _query_record(case: Case, group: str | None, split: str, texts: dict[str, str]) -> dict[str, Any]:
    rec: dict[str, Any] = {"query_id": case.query_id, "query": case.query}
    if case.relevant:
        rec["relevant"] = case.relevant
    if case.nonrelevant:
        rec["nonrelevant"] = list(case.nonrelevant)
    if case.evidence:  # each span with its quote, so `rag-ablate validate` can check it later
        rec["evidence"] = [
            {"doc_id": d, "start": s, "end": e, "quote": texts[d][s:e]} for d, s, e in case.evidence
        ]
    rec["answerable"] = case.answerable
    if case.references:
        rec["reference_answer"] = case.references
    rec["split"] = split
    if group is not None:
        rec["group"] = group
    rec["tags"] = case.tags
    if case.metadata:
        rec["metadata"] = case.metadata
    if case.human_judgements:
        rec["human_judgements"] = case.human_judgements
    return rec


# --------------------------------------------------------------------------- the output folder


def _check_out_dir(out_dir: Path, source: Path, overwrite: bool) -> bool:
    """Whether ``out_dir`` exists and must be replaced. Raises when it must not be touched."""
    src, dst = source.resolve(), out_dir.resolve()
    if dst == src or dst in src.parents:
        raise DatasetError(f"the output folder {out_dir} holds the source {source}; choose another folder")
    if not out_dir.exists():
        return False
    if not out_dir.is_dir():
        raise DatasetError(f"the output path {out_dir} exists and is not a folder", file=str(out_dir))
    entries = sorted(out_dir.iterdir())
    if not entries:
        return True
    if not overwrite:
        raise DatasetError(
            f"the output folder {out_dir} exists and is not empty; pass overwrite=True (--overwrite) "
            "to replace it",
            file=str(out_dir),
        )
    dataset_files = {CORPUS_FILE, QUERIES_FILE, INTENTS_FILE}
    if not any(e.name in dataset_files for e in entries) or any(e.is_dir() for e in entries):
        raise DatasetError(
            f"refusing to replace {out_dir}: it does not look like a dataset folder "
            "(no corpus.jsonl / queries.jsonl, or it has subfolders)",
            file=str(out_dir),
        )
    return True


def _sibling(out_dir: Path, tag: str) -> Path:
    """A fresh hidden name beside ``out_dir`` (same file system, so rename is atomic)."""
    while True:
        path = out_dir.parent / f".{out_dir.name}.{tag}-{os.getpid()}-{secrets.token_hex(4)}"
        if not path.exists():
            return path


def _move_into_place(tmp: Path, out_dir: Path, replace: bool) -> None:
    if not replace:
        os.rename(tmp, out_dir)
        return
    old = _sibling(out_dir, "old")
    os.rename(out_dir, old)
    try:
        os.rename(tmp, out_dir)
    except OSError:
        os.rename(old, out_dir)
        raise
    shutil.rmtree(old)


# --------------------------------------------------------------------------- driver


def import_dataset(
    fmt: str,
    source: Path,
    out_dir: Path,
    *,
    doc_unit: str = "context",
    holdout_share: float = 0.3,
    seed: int = 0,
    overwrite: bool = False,
) -> ImportReport:
    """Import ``source`` (format ``fmt``, a name in :data:`IMPORTERS`) into the dataset folder ``out_dir``.

    The folder is written beside ``out_dir`` under a temporary name, validated with
    :func:`load_dataset`, and renamed into place only when it passes; on any failure
    nothing is left behind.
    """
    importer = IMPORTERS.get(fmt)()
    if doc_unit not in importer.doc_units:
        if doc_unit not in doc_units():
            raise UnknownNameError("document unit", doc_unit, doc_units())
        raise ConfigError(
            f"doc_unit='{doc_unit}' does not apply to the {fmt} format (it takes: "
            f"{', '.join(importer.doc_units)})"
        )
    if not 0.0 <= holdout_share <= 1.0:
        raise ConfigError(f"holdout_share must be in [0, 1], got {holdout_share}")
    source, out_dir = Path(source).expanduser(), Path(out_dir).expanduser()
    if not source.exists():
        raise DatasetError(f"source not found: {source}", file=str(source))
    replace = _check_out_dir(out_dir, source, overwrite)

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = _sibling(out_dir, "importing")
    tmp.mkdir()  # honours the umask, unlike tempfile.mkdtemp
    run = ImportRun()
    try:
        with (tmp / CORPUS_FILE).open("wb") as fh:
            cases = importer.read(source, JsonlWriter(fh, run), run, doc_unit=doc_unit)
        if run.documents == 0:
            raise DatasetError(
                f"nothing to import: no document of {source} could be mapped", file=str(source)
            )
        if not cases:
            first = "; ".join(f"{i}: {r}" for i, r in run.skipped[:3])
            raise DatasetError(
                f"nothing to import: no query of {source} could be mapped ({len(run.skipped)} skipped"
                + (f", e.g. {first}" if first else "")
                + ")",
                file=str(source),
            )
        groups, splits, multi = _groups_and_splits(cases, holdout_share, seed, run)
        texts = _evidence_texts(tmp / CORPUS_FILE, cases)
        with (tmp / QUERIES_FILE).open("wb") as fh:
            qwriter = JsonlWriter(fh, run)
            for case, group, split in zip(cases, groups, splits, strict=True):
                qwriter.write(_query_record(case, group, split, texts))
        if run.surrogates:
            run.note("text", f"{run.surrogates} lone surrogate character(s) replaced by U+FFFD")
        dataset = load_dataset(tmp, holdout_share=holdout_share, seed=seed)
        if len(dataset.queries) != len(cases) or len(dataset.documents) != run.documents:
            raise DatasetError("internal error: the written dataset does not match the import", file=str(tmp))
        _move_into_place(tmp, out_dir, replace)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    answerable = sum(1 for c in cases if c.answerable)
    return ImportReport(
        format=fmt,
        source=str(source),
        out_dir=str(out_dir),
        documents=run.documents,
        queries=len(cases),
        answerable=answerable,
        unanswerable=len(cases) - answerable,
        skipped=run.skipped,
        relocated_spans=run.relocated,
        groups_multi=multi,
        splits={s: splits.count(s) for s in SPLITS},
        notes=run.notes,
        mapped=dict(run.mapped),
    )
