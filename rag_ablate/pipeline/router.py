"""A simple intent router over intent descriptions and examples.

Texts are normalised (NFKC, casefold, punctuation and spaces removed) and turned
into character 1..n-gram TF-IDF vectors. With ``profile="centroid"`` each intent
is one vector built from its description and all its examples; with
``profile="nearest"`` each description and example is its own vector and an
intent scores its best one. A query goes to the most similar intent (cosine).
Works for Chinese and English alike, needs no model and is deterministic (ties
go to the first intent id). On the embedded sample, centroid routes about 47%
of the queries right, nearest about 38%.
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from rag_ablate.core.errors import UnknownNameError
from rag_ablate.dataset.model import Intent
from rag_ablate.pipeline.stages import ROUTERS

if TYPE_CHECKING:  # scipy is imported when a router is built, not when the registry lists it
    from scipy import sparse

    from rag_ablate.config.schema import RunConfig

_DROP = re.compile(r"[\s\W_]+", re.UNICODE)


def _grams(text: str, n: int) -> Counter[str]:
    t = _DROP.sub("", unicodedata.normalize("NFKC", text).casefold())
    grams: Counter[str] = Counter()
    for size in range(1, n + 1):
        grams.update(t[i : i + size] for i in range(len(t) - size + 1))
    return grams


PROFILES = ("centroid", "nearest")


class IntentRouter:
    def __init__(self, intents: Sequence[Intent], ngram: int = 2, profile: str = "centroid") -> None:
        if profile not in PROFILES:
            raise UnknownNameError("router profile", profile, PROFILES)
        self.ngram = ngram
        self.labels = sorted(i.intent_l2 for i in intents)
        label_index = {name: j for j, name in enumerate(self.labels)}
        entries: list[tuple[int, Counter[str]]] = []
        for intent in intents:
            texts = (intent.description, *intent.examples)
            if profile == "centroid":
                texts = ("\n".join(texts),)
            for text in texts:
                entries.append((label_index[intent.intent_l2], _grams(text, ngram)))
        df: Counter[str] = Counter()
        for _, g in entries:
            df.update(g.keys())
        self.vocab = {term: j for j, term in enumerate(sorted(df))}
        n = len(entries)
        self.idf = np.array([math.log((1 + n) / (1 + df[t])) + 1.0 for t in sorted(df)])
        self.entry_label = np.array([lab for lab, _ in entries], dtype=np.int64)
        from scipy import sparse

        self.matrix = sparse.vstack([self._vector(g) for _, g in entries]).tocsr()

    def _vector(self, grams: Counter[str]) -> sparse.csr_matrix:
        from scipy import sparse

        cols = [self.vocab[t] for t in grams if t in self.vocab]
        vals = np.array([grams[t] for t in grams if t in self.vocab], dtype=np.float64)
        vals = vals * self.idf[cols] if cols else vals
        norm = float(np.linalg.norm(vals)) if cols else 0.0
        if norm > 0:
            vals = vals / norm
        return sparse.csr_matrix((vals, ([0] * len(cols), cols)), shape=(1, len(self.vocab)))

    def route(self, query: str) -> tuple[str | None, float]:
        """Predicted leaf intent and its cosine similarity (None when nothing overlaps)."""
        sims = (self.matrix @ self._vector(_grams(query, self.ngram)).T).toarray().ravel()
        best = np.zeros(len(self.labels))
        np.maximum.at(best, self.entry_label, sims)
        j = int(np.argmax(best))  # first maximum: lowest intent id among ties
        if best[j] <= 0:
            return None, 0.0
        return self.labels[j], float(best[j])


@ROUTERS.register("centroid")
def centroid_router(settings: RunConfig, intents: Sequence[Intent]) -> IntentRouter:
    """``router=centroid``: one TF-IDF profile per intent."""
    return IntentRouter(intents, settings.router.ngram, "centroid")


@ROUTERS.register("nearest")
def nearest_router(settings: RunConfig, intents: Sequence[Intent]) -> IntentRouter:
    """``router=nearest``: an intent scores its most similar description or example."""
    return IntentRouter(intents, settings.router.ngram, "nearest")


@ROUTERS.register("none")
def no_router(settings: RunConfig, intents: Sequence[Intent]) -> None:
    """``router=none``: no intent prediction (intent metrics are skipped)."""
    return None
