"""Chunking by size and overlap, keeping every chunk's place in its document.

Units are characters for CJK text (no spaces to split on) and whitespace tokens
for space-separated text; ``unit=auto`` decides per corpus. Every chunk keeps its
``doc_id`` and its ``[start, end)`` character offsets in the document text, so
evidence spans can be judged against any chunking.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from rag_ablate.cache import code_parts
from rag_ablate.dataset import Document
from rag_ablate.metrics.text import is_cjk_text

if TYPE_CHECKING:
    from rag_ablate.config import ChunkConfig

# characters after which a chunk may end (sentence or clause boundaries, line breaks)
_BOUNDARY = frozenset("。！？；!?;\n")
_TOKEN = re.compile(r"\S+")


@dataclass(frozen=True)
class Chunk:
    chunk_id: str
    doc_id: str
    start: int
    end: int
    text: str
    title: str | None = None

    def index_text(self, include_title: bool) -> str:
        return f"{self.title}\n{self.text}" if include_title and self.title else self.text


def detect_unit(texts: Iterable[str], sample_chars: int = 20_000) -> str:
    """``char`` when the corpus is mostly CJK, else ``token``."""
    taken: list[str] = []
    n = 0
    for t in texts:
        taken.append(t[:2_000])
        n += len(taken[-1])
        if n >= sample_chars:
            break
    return "char" if is_cjk_text("".join(taken)) else "token"


def _windows_char(text: str, size: int, overlap: int, snap: bool) -> list[tuple[int, int]]:
    spans: list[tuple[int, int]] = []
    n = len(text)
    start = 0
    while start < n:
        end = min(start + size, n)
        if snap and end < n:
            floor = start + max(1, int(size * 0.7))
            for i in range(end, floor, -1):
                if text[i - 1] in _BOUNDARY:
                    end = i
                    break
        spans.append((start, end))
        if end >= n:
            break
        start = max(end - overlap, start + 1)
    return spans


def _windows_token(text: str, size: int, overlap: int, snap: bool) -> list[tuple[int, int]]:
    tokens = [(m.start(), m.end()) for m in _TOKEN.finditer(text)]
    if not tokens:
        return [(0, len(text))] if text else []
    spans: list[tuple[int, int]] = []
    i = 0
    while i < len(tokens):
        j = min(i + size, len(tokens))
        if snap and j < len(tokens):
            floor = i + max(1, int(size * 0.7))
            for jj in range(j, floor, -1):
                if text[tokens[jj - 1][1] - 1] in ".!?;":
                    j = jj
                    break
        spans.append((tokens[i][0], tokens[j - 1][1]))
        if j >= len(tokens):
            break
        i = max(j - overlap, i + 1)
    return spans


def chunk_document(doc: Document, size: int, overlap: int, unit: str, snap: bool = True) -> list[Chunk]:
    """Split one document; ``unit`` is ``char`` or ``token`` (resolve ``auto`` first)."""
    windows = _windows_char if unit == "char" else _windows_token
    return [
        Chunk(f"{doc.doc_id}#{i}", doc.doc_id, s, e, doc.text[s:e], doc.title)
        for i, (s, e) in enumerate(windows(doc.text, size, overlap, snap))
    ]


def chunk_corpus(
    docs: Sequence[Document], size: int, overlap: int, unit: str = "auto", snap: bool = True
) -> tuple[list[Chunk], str]:
    """Chunk every document; returns the chunks and the unit actually used."""
    if unit == "auto":
        unit = detect_unit(d.text for d in docs)
    chunks: list[Chunk] = []
    for d in docs:
        chunks.extend(chunk_document(d, size, overlap, unit, snap))
    return chunks, unit


# chunk settings that change the indexed text but not where chunks start and end
# (the BM25 and embedding keys hold them)
_TEXT_ONLY_SETTINGS = ("include_title",)


def chunk_key_parts(settings: ChunkConfig, corpus_fingerprint: str, unit: str) -> dict[str, Any]:
    """The cache key parts of the ``chunks`` stage: everything chunk boundaries depend on.

    Every chunk setting except ``include_title`` (with ``unit`` replaced by the resolved
    ``char`` or ``token``, so ``auto`` shares the entry of what it resolves to), the corpus
    fingerprint, and the code: package and Python versions and a hash of this module.
    """
    if unit not in ("char", "token"):
        raise ValueError(f"unit must be resolved to 'char' or 'token' before keying, got {unit!r}")
    chosen = {k: v for k, v in asdict(settings).items() if k not in _TEXT_ONLY_SETTINGS}
    return {
        "corpus": corpus_fingerprint,
        **chosen,
        "unit": unit,
        "code": code_parts("rag_ablate.pipeline.chunking"),
    }
