"""Near-duplicate groups of queries: :func:`group_near_duplicates` and its result.

Normalises the queries (:mod:`rag_ablate.dataset.grouping.normalize`), joins the
similar ones (:mod:`rag_ablate.dataset.grouping.join`) and names the groups.

Explicit groups
---------------
An item with an explicit ``group`` keeps it verbatim. Items without one are
grouped among themselves only: they are never merged into an explicit group,
and explicit groups are never merged with each other. Reason: an explicit
group is an authoritative decision of the dataset author; letting a computed
link add members to it (or chain two explicit groups together through an
unlabelled near-duplicate) would override that decision silently. Caveat: a
dataset that labels only some groups must label all near-duplicates of them,
or those can land in the other split.

Computed group ids are ``"g:<id of the group's first item in input order>"``
(singletons too). Should such an id equal an explicit group value, ``~2``,
``~3`` ... is appended until it is free.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from rag_ablate.core.errors import DatasetError
from rag_ablate.dataset.grouping.join import check_params, components
from rag_ablate.dataset.grouping.normalize import normalize_many

__all__ = ["GroupingResult", "group_near_duplicates"]


@dataclass(frozen=True)
class GroupingResult:
    """Outcome of :func:`group_near_duplicates`.

    ``group_of[i]`` is the group id of input item i; ``sizes`` maps every
    group id to its size, in order of first appearance; ``method`` is
    ``"exact"`` or ``"minhash"``. ``timings`` holds seconds per stage
    (``normalise``, ``shingle``, ``minhash``, ``candidates_verify``,
    ``union_find``, ``total``) and pair counts (``pairs_prefiltered``,
    ``pairs_verified``, ``pairs_accepted``); it takes no part in equality.
    """

    group_of: list[str]
    n_groups: int
    sizes: dict[str, int]
    method: str
    timings: dict[str, float] = field(default_factory=dict, compare=False, repr=False)

    def largest(self, k: int = 5) -> list[tuple[str, int]]:
        """The k largest groups as (group id, size); equal sizes by first appearance."""
        if k <= 0:
            return []
        return sorted(self.sizes.items(), key=lambda kv: -kv[1])[:k]


def group_near_duplicates(
    texts: Sequence[str],
    *,
    ids: Sequence[str] | None = None,
    explicit: Sequence[str | None] | None = None,
    threshold: float = 0.7,
    n: int = 4,
    exact_limit: int = 2_000,
    num_perm: int = 128,
    seed: int = 0,
) -> GroupingResult:
    """Group near-duplicate queries.

    Items with an explicit group (``explicit[i]`` not None) keep it verbatim;
    the others are joined when the Jaccard similarity of their normalised
    character n-gram sets is >= ``threshold`` (transitively). Exact when the
    items without explicit group have at most ``exact_limit`` distinct
    normalised texts, MinHash-LSH (``num_perm`` permutations seeded by
    ``seed``) with exact verification otherwise; see :mod:`rag_ablate.dataset.grouping.join`.

    ``ids`` name the items (default: their positions ``"0"``, ``"1"``, ...);
    they must be unique. Computed group ids are ``"g:<id of first member>"``.
    """
    t_start = time.perf_counter()
    check_params(threshold, n, exact_limit, num_perm)
    count = len(texts)
    if ids is None:
        ids = [str(i) for i in range(count)]
    elif len(ids) != count:
        raise ValueError(f"{len(ids)} ids for {count} texts")
    else:
        seen: set[str] = set()
        for i, item_id in enumerate(ids):
            if item_id in seen:
                raise DatasetError(f"duplicate query id '{item_id}' (item {i})", field="query_id")
            seen.add(item_id)
    if explicit is not None and len(explicit) != count:
        raise ValueError(f"{len(explicit)} explicit groups for {count} texts")

    free = [i for i in range(count) if explicit is None or explicit[i] is None]
    stages = ("normalise", "shingle", "minhash", "candidates_verify", "union_find")
    counters = ("pairs_prefiltered", "pairs_verified", "pairs_accepted")
    timings: dict[str, float] = dict.fromkeys((*stages, *counters), 0.0)
    t0 = time.perf_counter()
    norm = normalize_many([texts[i] for i in free])
    timings["normalise"] = time.perf_counter() - t0
    if free:
        labels, method = components(
            norm,
            threshold=threshold,
            n=n,
            exact_limit=exact_limit,
            num_perm=num_perm,
            seed=seed,
            timings=timings,
        )
    else:
        labels, method = [], "exact"

    taken = {g for g in explicit or () if g is not None}
    group_of: list[str] = [""] * count
    name_of: dict[int, str] = {}
    for i, label in zip(free, labels, strict=True):
        name = name_of.get(label)
        if name is None:
            base = name = f"g:{ids[i]}"
            k = 1
            while name in taken:
                k += 1
                name = f"{base}~{k}"
            taken.add(name)
            name_of[label] = name
        group_of[i] = name
    if explicit is not None:
        for i, g in enumerate(explicit):
            if g is not None:
                group_of[i] = g
    sizes: dict[str, int] = {}
    for g in group_of:
        sizes[g] = sizes.get(g, 0) + 1
    timings["total"] = time.perf_counter() - t_start
    return GroupingResult(group_of=group_of, n_groups=len(sizes), sizes=sizes, method=method, timings=timings)
