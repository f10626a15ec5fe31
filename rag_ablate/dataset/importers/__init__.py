"""Import public QA / retrieval datasets into the dataset contract (docs/dataset-format.md).

``rag-ablate import FORMAT SOURCE OUT_DIR`` and :func:`import_dataset` take any
format registered in :data:`IMPORTERS`; each lives in its own module:

``squad`` (:mod:`rag_ablate.dataset.importers.squad`)
    SQuAD v1.1 / v2.0 JSON and the common variants of its layout (string or numeric
    ``is_impossible``, answers with empty text, yes/no answers, ``plausible_answers``).
``beir`` (:mod:`rag_ablate.dataset.importers.beir`)
    A BEIR folder: corpus.jsonl, queries.jsonl, qrels/{train,dev,test}.tsv.
``clapnq`` (:mod:`rag_ablate.dataset.importers.clapnq`)
    ClapNQ's answerable and unanswerable jsonl files.

Every import writes ``corpus.jsonl`` and ``queries.jsonl`` (UTF-8, one JSON object a
line) with explicit ``split`` for every query and explicit ``group`` for the
near-duplicate groups with more than one member, validates the result with
:func:`rag_ablate.dataset.load.load_dataset`, and only then moves it into place: a
failed import leaves no half-written folder behind. Nothing that cannot be mapped
is dropped silently; it is listed in :attr:`ImportReport.skipped` with a reason,
and every non-canonical variant mapped is counted in :attr:`ImportReport.mapped`.
Output is deterministic: the same input gives byte-identical files.

A new format is one module with an :class:`Importer` subclass decorated with
``@IMPORTERS.register("name")``, listed in the registry's ``providers``
(:mod:`rag_ablate.dataset.importers.common`).
"""

from __future__ import annotations

from rag_ablate.dataset.importers.common import (
    IMPORTERS,
    Case,
    Importer,
    ImportReport,
    ImportRun,
    JsonlWriter,
    doc_units,
    import_dataset,
)

__all__ = [
    "IMPORTERS",
    "Case",
    "ImportReport",
    "ImportRun",
    "Importer",
    "JsonlWriter",
    "doc_units",
    "import_dataset",
]


def __getattr__(name: str) -> tuple[str, ...]:
    """``FORMATS``: the names of the registered formats (kept for older callers)."""
    if name == "FORMATS":
        return IMPORTERS.names()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
