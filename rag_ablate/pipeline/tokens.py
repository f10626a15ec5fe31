"""Each chunk's analyzer output, computed once per chunking and analyzer (the ``tokens`` cache stage).

Every BM25 setting (``k1``, ``b``, ``method``) over the same chunks reads the same tokens, so
a ``retrieval.bm25.k1`` sweep analyses the corpus once. What BM25 needs of a chunk is which
tokens it holds and how often, and its length, so that is what is kept, as token ids:

- ``vocab``: token id -> token;
- ``doc_len``: per chunk, its number of tokens (repeats counted);
- a token-major sparse matrix of term frequencies: token ``t`` occurs in chunks
  ``docs[indptr[t]:indptr[t + 1]]`` (ascending) with counts ``tf[...]``.

:meth:`TokenMatrix.build` reads the texts once, in batches: per batch it maps tokens to ids
and counts them with numpy, keeping three int32 numbers per distinct (chunk, token) pair and
never a list of token strings for the corpus. docs/architecture.md ("Tokens") has the layout
and the measurements.
"""

from __future__ import annotations

import itertools
import json
import multiprocessing
import os
import warnings
from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Sized
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rag_ablate.core.cache import code_parts
from rag_ablate.text.analyzers import Analyzer, analyzer_key_parts

BATCH = 4096  # texts analysed per batch
PARALLEL_MIN = 2048  # fewer texts than this are analysed in this process
_SUB = 256  # texts per task sent to a worker process
_FILES = ("doc_len", "indptr", "docs", "tf")


@dataclass
class TokenMatrix:
    """The analyzer's tokens of every chunk, as token ids (see the module docstring)."""

    vocab: list[str]
    doc_len: np.ndarray  # int32 (chunks,)
    indptr: np.ndarray  # int64 (tokens + 1,)
    docs: np.ndarray  # int32 (pairs,)
    tf: np.ndarray  # int32 (pairs,)

    @property
    def n_chunks(self) -> int:
        return int(self.doc_len.shape[0])

    @property
    def nbytes(self) -> int:
        return int(sum(getattr(self, name).nbytes for name in _FILES))

    def chunk_tokens(self, i: int) -> dict[str, int]:
        """Chunk ``i``'s tokens and their counts (a slow scan, for tests and inspection)."""
        hit = np.flatnonzero(self.docs == i)
        terms = np.searchsorted(self.indptr, hit, side="right") - 1
        return {self.vocab[int(t)]: int(self.tf[j]) for t, j in zip(terms, hit, strict=True)}

    # ------------------------------------------------------------------ build

    @classmethod
    def build(
        cls,
        texts: Iterable[str],
        analyzer: Analyzer,
        *,
        batch: int = BATCH,
        progress: bool = False,
        workers: int | None = None,
    ) -> TokenMatrix:
        """Analyse ``texts`` (read once, in order; a lazy sequence stays lazy) in batches.

        ``workers``: processes that run the analyzer (None: :func:`default_workers`). With more
        than one and at least :data:`PARALLEL_MIN` texts, forked worker processes analyse blocks
        of texts while this process maps their tokens to ids, in the texts' order: the result is
        the same whatever the number of workers. A few blocks are in flight at a time, so memory
        stays bounded.
        """
        vocab: dict[str, int] = {}
        lens: list[np.ndarray] = []
        parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # per batch: terms, docs, tf
        it = iter(texts)
        if progress:
            from tqdm import tqdm

            total = len(texts) if isinstance(texts, Sized) else None
            it = iter(tqdm(it, total=total, desc="tokens", unit="chunk", leave=False))
        n_workers = default_workers() if workers is None else max(1, workers)
        if n_workers > 1 and not (isinstance(texts, Sized) and len(texts) >= PARALLEL_MIN):
            n_workers = 1
        with _TokenLists(it, analyzer, n_workers) as token_lists:
            start = 0
            while True:
                block = list(itertools.islice(token_lists, batch))
                if not block:
                    break
                ids: list[int] = []
                counts = np.empty(len(block), dtype=np.int64)
                add = vocab.setdefault
                for j, toks in enumerate(block):
                    counts[j] = len(toks)
                    ids.extend([add(t, len(vocab)) for t in toks])
                del block
                parts.append(_count_pairs(np.asarray(ids, dtype=np.int64), counts, start))
                lens.append(counts.astype(np.int32))
                start += counts.shape[0]
        doc_len = np.concatenate(lens) if lens else np.zeros(0, dtype=np.int32)
        indptr, docs, tf = _token_major(parts, len(vocab))
        return cls(list(vocab), doc_len, indptr, docs, tf)

    # ------------------------------------------------------------------ storage

    def save(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        for name in _FILES:
            with (folder / f"{name}.npy").open("wb") as f:
                np.save(f, getattr(self, name), allow_pickle=False)
        (folder / "vocab.json").write_text(json.dumps(self.vocab, ensure_ascii=False), encoding="utf-8")

    @classmethod
    def load(cls, folder: Path, *, mmap: bool = True) -> TokenMatrix:
        """A saved matrix; ``mmap`` maps the arrays instead of reading them."""
        arrays = {
            name: np.load(folder / f"{name}.npy", mmap_mode="r" if mmap else None, allow_pickle=False)
            for name in _FILES
        }
        vocab = json.loads((folder / "vocab.json").read_text(encoding="utf-8"))
        return cls(vocab, arrays["doc_len"], arrays["indptr"], arrays["docs"], arrays["tf"])


def default_workers() -> int:
    """Analyzer processes for a large build: ``RAG_ABLATE_TOKEN_WORKERS`` if set, else the CPUs this
    process may use (at most 8); 1 where processes cannot be forked."""
    if "fork" not in multiprocessing.get_all_start_methods():
        return 1
    env = os.environ.get("RAG_ABLATE_TOKEN_WORKERS")
    if env:
        try:
            return max(1, int(env))
        except ValueError:
            return 1
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    return min(8, cpus)


# the analyzer of the build that forked the workers (inherited by them; nothing is pickled)
_WORKER_ANALYZER: list[Analyzer] = []


def _analyse(texts: list[str]) -> list[list[str]]:
    analyzer = _WORKER_ANALYZER[0]
    return [analyzer(t) for t in texts]


class _TokenLists:
    """Each text's tokens, in order: analysed here, or by forked workers a few blocks ahead."""

    def __init__(self, texts: Iterator[str], analyzer: Analyzer, workers: int) -> None:
        self.texts, self.analyzer, self.workers = texts, analyzer, workers
        self.pool: ProcessPoolExecutor | None = None

    def __enter__(self) -> Iterator[list[str]]:
        if self.workers <= 1:
            return (self.analyzer(t) for t in self.texts)
        # the first text is analysed here, before the fork: what the analyzer loads on first use
        # (jieba's dictionary) is then loaded once, and the workers inherit it
        first = list(itertools.islice(self.texts, 1))
        head = [self.analyzer(t) for t in first]
        _WORKER_ANALYZER[:] = [self.analyzer]
        self.pool = ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("fork"))
        return itertools.chain(head, self._parallel(self.pool))

    def _parallel(self, pool: ProcessPoolExecutor) -> Iterator[list[str]]:
        pending: deque[Future[list[list[str]]]] = deque()
        ahead = 4 * self.workers
        while True:
            while len(pending) < ahead:
                block = list(itertools.islice(self.texts, _SUB))
                if not block:
                    break
                with warnings.catch_warnings():
                    # Python 3.12+ warns that forking a threaded process may deadlock a child that
                    # takes a lock another thread held; the workers only run the analyzer
                    warnings.filterwarnings("ignore", r".*multi-threaded.*fork", DeprecationWarning)
                    pending.append(pool.submit(_analyse, block))
            if not pending:
                return
            yield from pending.popleft().result()

    def __exit__(self, *exc: object) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)
            self.pool = None
        _WORKER_ANALYZER.clear()


def _count_pairs(
    ids: np.ndarray, counts: np.ndarray, start: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One batch's distinct (token, chunk) pairs sorted by token then chunk, with their counts."""
    n = max(1, counts.shape[0])
    local = np.repeat(np.arange(counts.shape[0], dtype=np.int64), counts)
    pairs, tf = np.unique(ids * n + local, return_counts=True)
    return (pairs // n).astype(np.int32), (pairs % n + start).astype(np.int32), tf.astype(np.int32)


def _token_major(
    parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]], n_tokens: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Merge the batches' pairs into one token-major matrix (chunks ascending within a token).

    A counting sort: each batch is sorted by token and covers later chunks than the one
    before, so a pair's place is where its token's run starts, plus the pairs of that token
    in earlier batches, plus its rank within the batch. Each batch is freed once placed.
    """
    df = np.zeros(n_tokens, dtype=np.int64)
    for terms, _, _ in parts:
        df += np.bincount(terms, minlength=n_tokens)
    indptr = np.zeros(n_tokens + 1, dtype=np.int64)
    np.cumsum(df, out=indptr[1:])
    nnz = int(indptr[-1])
    docs = np.empty(nnz, dtype=np.int32)
    tf = np.empty(nnz, dtype=np.int32)
    heads = indptr[:-1].copy()
    parts.reverse()  # pop from the end = the first batch first
    while parts:
        terms, d, f = parts.pop()
        if terms.shape[0] == 0:
            continue
        run_start = np.flatnonzero(np.r_[True, terms[1:] != terms[:-1]])
        run_len = np.diff(np.r_[run_start, terms.shape[0]])
        rank = np.arange(terms.shape[0], dtype=np.int64) - np.repeat(run_start, run_len)
        where = heads[terms] + rank
        docs[where] = d
        tf[where] = f
        heads[terms[run_start]] += run_len
    return indptr, docs, tf


TOKENS_CODE = ("rag_ablate.text.analyzers", "rag_ablate.pipeline.tokens")


def tokens_key_parts(analyzer: str, chunks: Mapping[str, Any], include_title: bool) -> dict[str, Any]:
    """The cache key parts of the ``tokens`` stage: the chunks' key parts (corpus, chunking,
    its code), whether titles are analysed with the text, the analyzer expanded to its stop
    words, dictionary and library versions, and the code (package and Python versions, a hash
    of analyzers.py and tokens.py). No BM25 setting: every one shares the entry.
    """
    if analyzer == "auto":
        raise ValueError("resolve analyzer 'auto' to a language before keying")
    return {
        "chunks": dict(chunks),
        "include_title": include_title,
        "analyzer": analyzer_key_parts(analyzer),
        "code": code_parts(*TOKENS_CODE),
    }
