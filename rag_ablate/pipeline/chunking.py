"""Chunking by size and overlap, keeping every chunk's place in its document.

Units are characters for CJK text (no spaces to split on) and whitespace tokens
for space-separated text; ``unit=auto`` decides per corpus. Every chunk keeps its
``doc_id`` and its ``[start, end)`` character offsets in the document text, so
evidence spans can be judged against any chunking.

For large corpora the chunks of a corpus are kept as :class:`ChunkSpans` (numpy arrays of
document position, start, end and token count: about 24 bytes a chunk) and read through
lazy views: :class:`Chunks` (a ``Sequence[Chunk]`` that slices a chunk's text from its
document when asked), :class:`IndexTexts` (a ``Sequence[str]`` of the indexed texts) and
:class:`ChunkTokenCounts` (a ``Mapping`` from ``(doc_id, start, end)`` to the token count).
No second copy of the corpus text is ever made.
"""

from __future__ import annotations

import re
from array import array
from bisect import bisect_left
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, overload

import numpy as np

from rag_ablate.core.cache import code_parts
from rag_ablate.dataset.model import Document
from rag_ablate.text.count import is_cjk_text

if TYPE_CHECKING:
    from rag_ablate.config.schema import ChunkConfig

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


# --------------------------------------------------------------------------- compact chunks

_SPAN_FIELDS = ("doc", "start", "end", "tokens")


@dataclass(frozen=True)
class ChunkSpans:
    """Every chunk of a corpus as parallel arrays, in corpus order then position in the document.

    ``doc`` is the document's position in the corpus (int32), ``start``/``end`` its character
    offsets (int64) and ``tokens`` :func:`~rag_ablate.text.count.count_tokens` of
    ``text[start:end]`` (int32; the title is not counted).
    """

    doc: np.ndarray
    start: np.ndarray
    end: np.ndarray
    tokens: np.ndarray

    def __len__(self) -> int:
        return int(self.doc.shape[0])

    @classmethod
    def empty(cls) -> ChunkSpans:
        return cls(*(np.zeros(0, dtype=t) for t in (np.int32, np.int64, np.int64, np.int32)))

    def save(self, folder: Path) -> None:
        """One ``.npy`` file per field in ``folder`` (an existing folder)."""
        for name in _SPAN_FIELDS:
            np.save(folder / f"{name}.npy", getattr(self, name), allow_pickle=False)

    @classmethod
    def load(cls, folder: Path, n_docs: int) -> ChunkSpans:
        """Read what :meth:`save` wrote; ValueError when a file is missing or the arrays disagree
        (an entry of another layout, a damaged one, or one of another corpus)."""
        arrays: dict[str, np.ndarray] = {}
        for name in _SPAN_FIELDS:
            try:
                arrays[name] = np.load(folder / f"{name}.npy", allow_pickle=False)
            except (OSError, ValueError, EOFError) as exc:
                raise ValueError(f"chunk entry {folder}: cannot read {name}.npy ({exc})") from exc
        n = arrays["doc"].shape
        if any(a.ndim != 1 or a.shape != n for a in arrays.values()):
            raise ValueError(f"chunk entry {folder}: arrays of different lengths")
        doc = arrays["doc"]
        if doc.size and (doc.min() < 0 or doc.max() >= n_docs or np.any(np.diff(doc) < 0)):
            raise ValueError(f"chunk entry {folder}: document positions outside the corpus or out of order")
        return cls(**arrays)


def chunk_spans(
    docs: Sequence[Document], size: int, overlap: int, unit: str, snap: bool = True
) -> ChunkSpans:
    """The chunks of ``docs`` (``unit`` resolved to ``char`` or ``token``) with their token counts,
    one document at a time: memory holds the arrays, never the chunk texts together.

    Equal to :func:`chunk_corpus`'s chunks, in the same order.
    """
    from rag_ablate.text.count import count_tokens

    windows = _windows_char if unit == "char" else _windows_token
    doc, start, end, tokens = array("i"), array("q"), array("q"), array("i")
    for i, d in enumerate(docs):
        text = d.text
        for s, e in windows(text, size, overlap, snap):
            doc.append(i)
            start.append(s)
            end.append(e)
            tokens.append(count_tokens(text[s:e]))
    return ChunkSpans(
        np.frombuffer(doc, dtype=np.int32).copy(),
        np.frombuffer(start, dtype=np.int64).copy(),
        np.frombuffer(end, dtype=np.int64).copy(),
        np.frombuffer(tokens, dtype=np.int32).copy(),
    )


def tiebreak_ranks(docs: Sequence[Document], spans: ChunkSpans) -> np.ndarray:
    """Each chunk's position in (doc_id, chunk number) order: lower wins a score tie."""
    n_docs = len(docs)
    by_id = sorted(range(n_docs), key=lambda i: docs[i].doc_id)
    doc_rank = np.empty(n_docs, dtype=np.int64)
    doc_rank[by_id] = np.arange(n_docs)
    order = np.argsort(doc_rank[spans.doc], kind="stable")  # rows of a document stay in order
    ranks = np.empty(len(spans), dtype=np.int64)
    ranks[order] = np.arange(len(spans))
    return ranks


T = TypeVar("T")


class _LazySequence(Sequence[T]):
    """A sequence whose item ``i`` is built by ``_one(i)`` when asked (never stored)."""

    what = "item"  # named in the IndexError

    def _one(self, i: int) -> T:
        raise NotImplementedError

    @overload
    def __getitem__(self, i: int) -> T: ...

    @overload
    def __getitem__(self, i: slice) -> list[T]: ...

    def __getitem__(self, i: int | slice) -> T | list[T]:
        if isinstance(i, slice):
            return [self._one(j) for j in range(*i.indices(len(self)))]
        n = len(self)
        j = int(i)
        if j < 0:
            j += n
        if not 0 <= j < n:
            raise IndexError(f"{self.what} index {i} out of range for {n} chunks")
        return self._one(j)

    def __iter__(self) -> Iterator[T]:
        for i in range(len(self)):
            yield self._one(i)


class Chunks(_LazySequence[Chunk]):
    """A lazy ``Sequence[Chunk]`` over :class:`ChunkSpans`: ``chunks[i]`` builds chunk i (its text
    sliced from its document) when asked; chunk ids are ``<doc_id>#<number in the document>``."""

    what = "chunk"

    def __init__(self, docs: Sequence[Document], spans: ChunkSpans) -> None:
        self.docs = docs
        self.spans = spans
        # the first row of every document (rows are in document order), for chunk numbers
        self.first = np.searchsorted(spans.doc, np.arange(len(docs) + 1), side="left")

    def __len__(self) -> int:
        return len(self.spans)

    def _one(self, i: int) -> Chunk:
        sp = self.spans
        d = int(sp.doc[i])
        doc = self.docs[d]
        s, e = int(sp.start[i]), int(sp.end[i])
        return Chunk(f"{doc.doc_id}#{i - int(self.first[d])}", doc.doc_id, s, e, doc.text[s:e], doc.title)

    def locate(self, rows: Sequence[int]) -> list[tuple[str, str, int, int]]:
        """(chunk id, document id, start, end) of each chunk in ``rows``, as ``chunks[i]`` has them,
        without slicing any text: a ranked list's chunks in one gather. Rows are 0 <= row < len."""
        if not rows:
            return []
        idx = np.asarray(rows, dtype=np.intp)
        if idx.min() < 0 or idx.max() >= len(self):
            raise IndexError(f"{self.what} rows {rows} out of range for {len(self)} chunks")
        sp = self.spans
        d = sp.doc[idx]
        docs = self.docs
        numbers, starts, ends = (idx - self.first[d]).tolist(), sp.start[idx].tolist(), sp.end[idx].tolist()
        return [
            (f"{docs[di].doc_id}#{n}", docs[di].doc_id, s, e)
            for di, n, s, e in zip(d.tolist(), numbers, starts, ends, strict=True)
        ]

    def numbers(self) -> np.ndarray:
        """Each chunk's number within its document (the part of its id after ``#``)."""
        numbers: np.ndarray = np.arange(len(self), dtype=np.int64) - self.first[self.spans.doc]
        return numbers

    def doc_id(self, i: int) -> str:
        """The document of chunk ``i`` (without building the chunk)."""
        return self.docs[int(self.spans.doc[i])].doc_id


class IndexTexts(_LazySequence[str]):
    """A lazy ``Sequence[str]`` of each chunk's indexed text (:meth:`Chunk.index_text`), sliced from
    its document on demand. Iterate it or index it; ``list()`` of a large corpus copies all its text."""

    what = "text"

    def __init__(self, chunks: Chunks, include_title: bool) -> None:
        self.chunks = chunks
        self.include_title = include_title

    def __len__(self) -> int:
        return len(self.chunks)

    def _one(self, i: int) -> str:
        sp = self.chunks.spans
        doc = self.chunks.docs[int(sp.doc[i])]
        text = doc.text[int(sp.start[i]) : int(sp.end[i])]
        return f"{doc.title}\n{text}" if self.include_title and doc.title else text

    def lengths(self) -> np.ndarray:
        """Each text's length in characters, without slicing any text."""
        sp = self.chunks.spans
        n: np.ndarray = (sp.end - sp.start).astype(np.int64)
        if self.include_title and len(sp):
            extra = np.array([len(d.title) + 1 if d.title else 0 for d in self.chunks.docs], dtype=np.int64)
            n += extra[sp.doc]
        return n


ChunkKey = tuple[str, int, int]  # (doc_id, start, end)


class ChunkTokenCounts(Mapping[ChunkKey, int]):
    """``(doc_id, start, end) -> count_tokens(text[start:end])`` for every chunk, read from the arrays.

    A lookup gives what a dictionary of every chunk's key would give (a key equal to a chunk's
    key finds its count) without one: the document's position in a dictionary of document ids
    (made at the first lookup), then a binary search among its chunks' starts in the arrays, read
    as Python ints through memoryviews. Nothing else is made or kept, whatever is looked up. Any
    other key (not a chunk of this chunking, of an unknown document, not a 3-tuple, unhashable, a
    start that does not order with ints) is a KeyError from ``counts[key]`` and ``default`` from
    :meth:`get`. Safe to share between threads (a race can only make the dictionary twice, the same).
    """

    def __init__(self, chunks: Chunks) -> None:
        self.chunks = chunks
        self._doc_pos: dict[str, int] | None = None  # document id -> position, made at the first lookup
        # the arrays as memoryviews (made with _doc_pos): an item is a Python int, no numpy scalar
        self._first = self._start = self._end = self._tokens = memoryview(b"")

    def __len__(self) -> int:
        return len(self.chunks)

    def __iter__(self) -> Iterator[ChunkKey]:
        sp = self.chunks.spans
        docs = self.chunks.docs
        for i in range(len(sp)):
            yield (docs[int(sp.doc[i])].doc_id, int(sp.start[i]), int(sp.end[i]))

    def _positions(self) -> dict[str, int]:
        sp = self.chunks.spans
        # document d's rows: first[d] to first[d + 1]
        self._first = np.ascontiguousarray(self.chunks.first).data
        self._start = np.ascontiguousarray(sp.start).data
        self._end = np.ascontiguousarray(sp.end).data
        self._tokens = np.ascontiguousarray(sp.tokens).data
        # set last: a thread that sees it sees the memoryviews
        self._doc_pos = {d.doc_id: i for i, d in enumerate(self.chunks.docs)}
        return self._doc_pos

    @overload
    def get(self, key: object, /) -> int | None: ...

    @overload
    def get(self, key: object, /, default: int | T) -> int | T: ...

    def get(self, key: object, /, default: object = None) -> object:
        if not isinstance(key, tuple) or len(key) != 3:
            return default
        doc_pos = self._doc_pos
        if doc_pos is None:
            doc_pos = self._positions()
        doc_id, start, end = key
        try:
            hash(key)  # as a dictionary: an unhashable key is no chunk's key
            d = doc_pos.get(doc_id)
            if d is None:
                return default
            lo, hi = self._first[d], self._first[d + 1]
            j = bisect_left(self._start, start, lo, hi)  # starts rise within a document
        except TypeError:  # an unhashable key, or a start that does not order with ints
            return default
        if j < hi and self._start[j] == start and self._end[j] == end:
            n: int = self._tokens[j]
            return n
        return default

    def __getitem__(self, key: ChunkKey) -> int:
        n = self.get(key)
        if n is None:
            raise KeyError(key)
        return n

    def __contains__(self, key: object) -> bool:
        return self.get(key) is not None


# chunk settings that change the indexed text but not where chunks start and end
# (the BM25 and embedding keys hold them)
_TEXT_ONLY_SETTINGS = ("include_title",)


def chunk_key_parts(settings: ChunkConfig, corpus_fingerprint: str, unit: str) -> dict[str, Any]:
    """The cache key parts of the ``chunks`` stage: everything chunk boundaries depend on.

    Every chunk setting except ``include_title`` (with ``unit`` replaced by the resolved
    ``char`` or ``token``, so ``auto`` shares the entry of what it resolves to), the corpus
    fingerprint, and the code: package and Python versions and a hash of this module and of
    :mod:`rag_ablate.text.count` (the entry holds each chunk's token count).
    """
    if unit not in ("char", "token"):
        raise ValueError(f"unit must be resolved to 'char' or 'token' before keying, got {unit!r}")
    chosen = {k: v for k, v in asdict(settings).items() if k not in _TEXT_ONLY_SETTINGS}
    return {
        "corpus": corpus_fingerprint,
        **chosen,
        "unit": unit,
        # the entry holds each chunk's count_tokens too, so the counting code is part of the key
        "code": code_parts("rag_ablate.pipeline.chunking", "rag_ablate.text.count"),
    }
