"""Generate a benchmark dataset folder (docs/dataset-format.md), deterministic for a seed.

Nothing here is committed: the folders are written where you say and rebuilt in seconds
to minutes. Two kinds:

``en``: English synthetic at a target number of chunks. Every document is one chunk
under the default chunking (``chunk=512``: 512 whitespace tokens; documents have 60-140
words, mean 100, like the 100-word passages of DPR/BEIR corpora), so ``--chunks N``
writes N documents. Words come from a generated pseudo-word vocabulary (50,000 words,
Zipf-Mandelbrot frequencies, shorter words more frequent, none of them an English stop
word); each document also repeats a few topic words of its own (drawn from the rare tail),
so terms are bursty as in real text and BM25 has real signal. Queries take a phrase of 4-7
consecutive words around a topic word of a target document, wrapped in a question
template (mostly stop words), with one word in five replaced by a random word; each
answerable query has ``relevant`` ({target: 2}) and an evidence span with its quote.
About 15% of queries come in near-duplicate families of 2-5 that differ only by an order
number (the tool's grouping joins them); 5% are unanswerable (random words, no
``relevant``). ``split`` and ``group`` are left to the tool.

``zh``: a Chinese set shaped like the one issue 16 describes (about 1,000 documents and
6,000 questions, about 7,600 chunks at the default 512 characters): documents recombine
the embedded sample's sentences (digits re-drawn), each document about a made-up entity
(a name of 2-3 characters and a suffix) that opens about a third of its sentences; queries
take the entity and a phrase of a sentence that carries it, in a question template; the
evidence is that sentence. Same shares of near-duplicate families and unanswerable
queries as ``en``.

    python benchmarks/gen_corpus.py en /tmp/bench_en_100k --chunks 100000 --queries 10000
    python benchmarks/gen_corpus.py zh /tmp/bench_zh --docs 1000 --queries 6000
    python benchmarks/gen_corpus.py ... --validate     # then load it with rag_ablate.dataset.load.load_dataset
"""

from __future__ import annotations

import argparse
import json
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from rag_ablate.dataset.load import load_dataset
from rag_ablate.dataset.model import CORPUS_FILE, QUERIES_FILE, sample_dataset_path
from rag_ablate.text.analyzers import EN_STOPWORDS

_ONSETS = ["b", "c", "d", "f", "g", "h", "j", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w", "z"]
_ONSETS += ["br", "cr", "dr", "fl", "gr", "pl", "st", "tr", "sh", "ch", "th", "sk", "sp"]
_VOWELS = ["a", "e", "i", "o", "u", "ai", "ea", "ou", "io"]
_CODAS = ["", "", "", "n", "r", "s", "l", "m", "t", "x"]
_EN_TEMPLATES = [
    "{p}",
    "what is {p}",
    "how do i {p}",
    "tell me about {p}",
    "is it true that {p}",
    "where can i find {p}",
    "why does {p}",
    "{p} explained",
]
_ZH_TEMPLATES = ["{e}{p}吗", "请问{e}的{p}怎么办", "{p}，{e}是这样吗", "关于{e}：{p}", "{e}{p}"]
_ZH_SUFFIXES = ["服务", "商城", "系列", "计划", "套餐", "专区", "会员", "门店"]
_FAMILY_SHARE = 0.15  # queries that belong to a near-duplicate family (order number varies)
_UNANSWERABLE_SHARE = 0.05


@dataclass
class Counts:
    docs: int = 0
    chars: int = 0
    queries: int = 0
    answerable: int = 0
    in_families: int = 0


def _vocabulary(rng: np.random.Generator, size: int) -> list[str]:
    """``size`` distinct pseudo-words, shortest first (rank 0 is the most frequent)."""
    words: set[str] = set()
    while len(words) < size:
        n_syll = int(rng.choice([1, 2, 2, 3, 3, 3, 4]))
        w = "".join(
            _ONSETS[rng.integers(len(_ONSETS))] + _VOWELS[rng.integers(len(_VOWELS))] for _ in range(n_syll)
        )
        w += _CODAS[rng.integers(len(_CODAS))]
        if w not in EN_STOPWORDS:
            words.add(w)
    return sorted(words, key=lambda w: (len(w), w))


def _zipf_probs(size: int, s: float = 1.0, q: float = 2.7) -> np.ndarray:
    p = 1.0 / np.power(np.arange(size) + q, s)
    return np.asarray(p / p.sum())


def _query_plan(rng: np.random.Generator, n_queries: int, n_docs: int) -> tuple[dict[int, list[int]], int]:
    """Which documents get which queries: doc index -> family sizes; and the unanswerable count.

    A family of size 1 is a plain query; larger ones are near-duplicates of one phrase.
    """
    n_unans = round(n_queries * _UNANSWERABLE_SHARE)
    remaining = n_queries - n_unans
    family_budget = round(n_queries * _FAMILY_SHARE)
    sizes: list[int] = []
    while family_budget >= 2:
        k = min(int(rng.integers(2, 6)), family_budget)
        sizes.append(k)
        family_budget -= k
    sizes += [1] * (remaining - sum(sizes))
    targets = rng.integers(0, n_docs, size=len(sizes))
    plan: dict[int, list[int]] = {}
    for t, k in zip(targets.tolist(), sizes, strict=True):
        plan.setdefault(int(t), []).append(k)
    return plan, n_unans


def _order_number(rng: np.random.Generator) -> str:
    return str(int(rng.integers(10_000_000, 99_999_999)))


def _write(f: TextIO, obj: dict[str, Any]) -> None:
    f.write(json.dumps(obj, ensure_ascii=False))
    f.write("\n")


# --------------------------------------------------------------------------- English


def _en_doc(
    rng: np.random.Generator, vocab: list[str], cdf: np.ndarray, n_words: int
) -> tuple[list[str], list[int], set[int]]:
    """Words of one document, the vocabulary ids, and the positions of its topic words."""
    ids = np.searchsorted(cdf, rng.random(n_words), side="right")
    ids = np.minimum(ids, len(vocab) - 1)
    topics = rng.integers(2_000, len(vocab), size=4)
    topic_pos = np.flatnonzero(rng.random(n_words) < 0.15)
    ids[topic_pos] = topics[rng.integers(0, 4, size=topic_pos.size)]
    words = [vocab[i] for i in ids.tolist()]
    ends = np.cumsum(rng.integers(8, 18, size=n_words // 8 + 2))
    for e in ends[ends < n_words].tolist():
        words[e - 1] += "."
    words[-1] = words[-1].rstrip(".") + "."
    return words, ids.tolist(), set(topic_pos.tolist())


def _en_queries(
    rng: np.random.Generator,
    words: list[str],
    text: str,
    topic_pos: set[int],
    doc_id: str,
    families: list[int],
    vocab: list[str],
) -> Iterator[tuple[dict[str, Any], bool]]:
    offsets: list[int] = []
    pos = 0
    for w in words:
        offsets.append(pos)
        pos += len(w) + 1
    anchors = sorted(topic_pos) or [len(words) // 2]
    for size in families:
        a = anchors[int(rng.integers(len(anchors)))]
        length = int(rng.integers(4, 8))
        lo = max(0, min(a - int(rng.integers(0, length)), len(words) - length))
        hi = lo + length
        phrase = [w.rstrip(".") for w in words[lo:hi]]
        noisy = int(rng.integers(len(phrase)))
        if rng.random() < 0.2:
            phrase[noisy] = vocab[int(rng.integers(len(vocab)))]
        start, end = offsets[lo], offsets[hi - 1] + len(words[hi - 1].rstrip("."))
        template = _EN_TEMPLATES[int(rng.integers(len(_EN_TEMPLATES)))]
        body = template.format(p=" ".join(phrase))
        for _ in range(size):
            q = body if size == 1 else f"order {_order_number(rng)}: {body}"
            yield (
                {
                    "query": q,
                    "relevant": {doc_id: 2},
                    "evidence": [{"doc_id": doc_id, "start": start, "end": end, "quote": text[start:end]}],
                },
                size > 1,
            )


def generate_en(out: Path, n_chunks: int, n_queries: int, seed: int) -> Counts:
    rng = np.random.default_rng(seed)
    vocab = _vocabulary(rng, 50_000)
    cdf = np.cumsum(_zipf_probs(len(vocab)))
    plan, n_unans = _query_plan(rng, n_queries, n_chunks)
    counts = Counts()
    queries: list[tuple[dict[str, Any], bool]] = []
    with (out / CORPUS_FILE).open("w", encoding="utf-8") as f:
        for d in range(n_chunks):
            doc_id = f"d{d:07d}"
            words, _, topic_pos = _en_doc(rng, vocab, cdf, int(rng.integers(60, 141)))
            text = " ".join(words)
            title_ids = np.searchsorted(cdf, rng.random(int(rng.integers(2, 6))), side="right")
            title = " ".join(vocab[min(i, len(vocab) - 1)] for i in title_ids.tolist()).capitalize()
            _write(f, {"doc_id": doc_id, "title": title, "text": text})
            counts.docs += 1
            counts.chars += len(text)
            if d in plan:
                queries.extend(_en_queries(rng, words, text, topic_pos, doc_id, plan[d], vocab))
    for _ in range(n_unans):
        ids = np.searchsorted(cdf, rng.random(int(rng.integers(3, 7))), side="right")
        q = " ".join(vocab[min(i, len(vocab) - 1)] for i in ids.tolist())
        queries.append(({"query": f"what about {q}"}, False))
    _write_queries(out, rng, queries, counts)
    return counts


def _write_queries(
    out: Path, rng: np.random.Generator, queries: list[tuple[dict[str, Any], bool]], counts: Counts
) -> None:
    order = rng.permutation(len(queries))
    with (out / QUERIES_FILE).open("w", encoding="utf-8") as f:
        for n, i in enumerate(order.tolist()):
            body, in_family = queries[i]
            _write(f, {"query_id": f"q{n:06d}", **body})
            counts.queries += 1
            counts.answerable += bool(body.get("relevant"))
            counts.in_families += in_family


# --------------------------------------------------------------------------- Chinese

_ZH_SENTENCE = re.compile(r"[^。！？\n]*[。！？]|[^。！？\n]+")
_CJK = re.compile(r"[\u4e00-\u9fff]")


def _sample_pool() -> tuple[list[str], list[str], list[str]]:
    """Sentences, titles and CJK characters of the embedded sample."""
    sentences: list[str] = []
    titles: list[str] = []
    chars: set[str] = set()
    with (sample_dataset_path() / CORPUS_FILE).open(encoding="utf-8") as f:
        for line in f:
            doc = json.loads(line)
            titles.append(doc.get("title") or doc["doc_id"])
            for m in _ZH_SENTENCE.finditer(doc["text"]):
                s = m.group().strip()
                if len(s) >= 8 and _CJK.search(s):
                    sentences.append(s)
            chars.update(_CJK.findall(doc["text"]))
    return sorted(set(sentences)), titles, sorted(chars)


def generate_zh(out: Path, n_docs: int, n_queries: int, seed: int, median_chars: int = 2_850) -> Counts:
    rng = np.random.default_rng(seed)
    sentences, titles, chars = _sample_pool()
    plan, n_unans = _query_plan(rng, n_queries, n_docs)
    counts = Counts()
    queries: list[tuple[dict[str, Any], bool]] = []
    used: set[str] = set()
    with (out / CORPUS_FILE).open("w", encoding="utf-8") as f:
        for d in range(n_docs):
            doc_id = f"zh{d:05d}"
            while True:
                name = "".join(
                    chars[int(i)] for i in rng.integers(0, len(chars), size=int(rng.integers(2, 4)))
                )
                entity = name + _ZH_SUFFIXES[int(rng.integers(len(_ZH_SUFFIXES)))]
                if entity not in used:
                    used.add(entity)
                    break
            target = int(np.clip(rng.lognormal(np.log(median_chars), 0.45), 600, 12_000))
            parts: list[str] = []
            spans: list[tuple[int, int]] = []  # sentences that carry the entity
            length = 0
            while length < target:
                s = sentences[int(rng.integers(len(sentences)))]
                s = re.sub(r"\d", lambda _m: str(int(rng.integers(10))), s)
                if rng.random() < 0.35:
                    s = f"{entity}：{s}"
                    spans.append((length, length + len(s)))
                sep = "\n" if rng.random() < 0.2 else ""
                parts.append(s + sep)
                length += len(s) + len(sep)
            text = "".join(parts)
            if not spans:
                text = f"{entity}：{text}"
                spans.append((0, text.index("\n") if "\n" in text else len(text)))
            title = f"{entity}·{titles[int(rng.integers(len(titles)))]}"
            _write(f, {"doc_id": doc_id, "title": title, "text": text})
            counts.docs += 1
            counts.chars += len(text)
            for size in plan.get(d, []):
                start, end = spans[int(rng.integers(len(spans)))]
                body_start = start + len(entity) + 1
                sent = text[body_start:end]
                n = int(rng.integers(6, 15))
                lo = int(rng.integers(0, max(1, len(sent) - n)))
                phrase = sent[lo : lo + n].strip("，。！？；：、 ")
                template = _ZH_TEMPLATES[int(rng.integers(len(_ZH_TEMPLATES)))]
                body = template.format(e=entity, p=phrase)
                ev = [{"doc_id": doc_id, "start": start, "end": end, "quote": text[start:end]}]
                for _ in range(size):
                    q = body if size == 1 else f"订单{_order_number(rng)}：{body}"
                    queries.append(({"query": q, "relevant": {doc_id: 2}, "evidence": ev}, size > 1))
    for _ in range(n_unans):
        s = sentences[int(rng.integers(len(sentences)))]
        n = int(rng.integers(6, 15))
        lo = int(rng.integers(0, max(1, len(s) - n)))
        queries.append(({"query": f"{s[lo : lo + n]}有没有相关规定"}, False))
    _write_queries(out, rng, queries, counts)
    return counts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("kind", choices=["en", "zh"])
    ap.add_argument("out", type=Path, help="dataset folder to write (created; its files are replaced)")
    ap.add_argument("--chunks", type=int, default=10_000, help="en: chunks = documents (one chunk each)")
    ap.add_argument("--docs", type=int, default=1_000, help="zh: documents")
    ap.add_argument("--queries", type=int, default=None, help="queries (default en 10,000, zh 6,000)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--validate", action="store_true", help="load the result with load_dataset")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    if a.kind == "en":
        c = generate_en(a.out, a.chunks, a.queries or 10_000, a.seed)
    else:
        c = generate_zh(a.out, a.docs, a.queries or 6_000, a.seed)
    print(
        f"{a.out}: {c.docs:,} documents ({c.chars / max(c.docs, 1):,.0f} chars each on average), "
        f"{c.queries:,} queries ({c.answerable:,} answerable, {c.in_families:,} in near-duplicate families) "
        f"in {time.perf_counter() - t0:.1f} s"
    )
    if a.validate:
        t0 = time.perf_counter()
        ds = load_dataset(a.out, seed=a.seed)
        n_groups = len({q.group for q in ds.queries})
        print(
            f"valid: {len(ds.documents):,} documents, {len(ds.queries):,} queries in {n_groups:,} groups, "
            f"labels {ds.labels.checked} checked / {ds.labels.stale} stale, loaded in {time.perf_counter() - t0:.1f} s"
        )


if __name__ == "__main__":
    main()
