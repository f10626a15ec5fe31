"""Access-control leakage (docs/metrics.md, "Access control").

The visibility rule, used by the metrics and by the local pipeline's filter
(``retrieval.acl_filter``):

* a document without ``allowed_groups`` is visible to everyone;
* a document with ``allowed_groups`` is visible to a user who belongs to at least one
  of them (``allowed_groups: []`` is visible to no one);
* a query without ``user_groups`` (or with an empty list) is asked by an anonymous
  user, who belongs to no group and so sees only unrestricted documents.

Per query, at every cutoff k, over the first k retrieved chunks (the ranked list a
generator reads, as ``context_tokens_at_k``):

* ``acl_leak_at_k``: the number of distinct documents among them the asking user may
  not see;
* ``acl_leak_rate_at_k``: 1 if ``acl_leak_at_k`` > 0, else 0 (its mean over a split is the
  share of queries with any leak in the top k).

Both are lower-is-better security metrics, reported beside the quality metrics and
never folded into them. They are computed only for datasets whose corpus restricts
some document (:func:`has_restrictions`); elsewhere a leak is impossible and the
metrics are absent.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from rag_ablate.metrics.registry import metric_name

if TYPE_CHECKING:
    from rag_ablate.dataset.model import Document

__all__ = ["ACL_BASES", "acl_metrics", "has_restrictions", "may_see"]

ACL_BASES: tuple[str, ...] = ("acl_leak", "acl_leak_rate")
"""The metric bases ``acl_metrics`` returns for every k, in this order."""

_RESTRICTED: dict[int, tuple[Mapping[str, Document], bool]] = {}  # id(docs) -> (docs, any restricted)
_RESTRICTED_MAX = 8


def may_see(allowed_groups: Iterable[str] | None, user_groups: Iterable[str] | None) -> bool:
    """Whether a user in ``user_groups`` (None or empty: anonymous) may see a document restricted
    to ``allowed_groups`` (None: unrestricted). See the module docstring."""
    if allowed_groups is None:
        return True
    if not user_groups:
        return False
    return not set(allowed_groups).isdisjoint(user_groups)


def has_restrictions(docs: Mapping[str, Document]) -> bool:
    """Whether any document of ``docs`` has ``allowed_groups`` (remembered per corpus object)."""
    hit = _RESTRICTED.get(id(docs))
    if hit is not None and hit[0] is docs:
        return hit[1]
    found = any(d.allowed_groups is not None for d in docs.values())
    if len(_RESTRICTED) >= _RESTRICTED_MAX:
        _RESTRICTED.pop(next(iter(_RESTRICTED)))
    _RESTRICTED[id(docs)] = (docs, found)  # the corpus is kept, so its id is never reused meanwhile
    return found


def acl_metrics(
    ranked_doc_ids: Sequence[str],
    docs: Mapping[str, Document],
    user_groups: Sequence[str] | None,
    ks: Sequence[int],
) -> dict[str, float]:
    """``acl_leak_at_k`` and ``acl_leak_rate_at_k`` for every k in ``ks``.

    ``ranked_doc_ids``: the document of each retrieved chunk, best first (a document may
    repeat; it counts once). An id that is not in ``docs`` raises ``KeyError``.
    """
    names = _names(ks)
    top = ranked_doc_ids[: max(ks, default=0)]
    hidden = [not may_see(docs[d].allowed_groups, user_groups) for d in top]  # each document once
    out: dict[str, float] = {}
    for k, leak, rate in names:
        leaked = {d for d, h in zip(top[:k], hidden, strict=False) if h}
        out[leak] = float(len(leaked))
        out[rate] = 1.0 if leaked else 0.0
    return out


_NAMES: dict[tuple[int, ...], list[tuple[int, str, str]]] = {}  # ks -> (k, leak name, rate name)


def _names(ks: Sequence[int]) -> list[tuple[int, str, str]]:
    """The metric names for every k, checked by the registry once per distinct ``ks`` of plain ints
    (a bool or another type is checked, and refused, every time)."""
    key = tuple(ks)
    names = _NAMES.get(key) if all(type(k) is int for k in key) else None
    if names is None:
        names = [(k, metric_name("acl_leak", k), metric_name("acl_leak_rate", k)) for k in key]
        if len(_NAMES) < 64:
            _NAMES[key] = names
    return names
