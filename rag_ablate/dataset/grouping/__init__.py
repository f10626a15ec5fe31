"""Near-duplicate query grouping and group-aware dev/holdout split assignment.

Why: near-duplicate queries (one template with another order number, date or
amount) are not independent samples, so the comparison step resamples *groups*
(see docs/statistics.md, "Near-duplicate grouping" and "Dev and holdout").

Modules
-------
* :mod:`~rag_ablate.dataset.grouping.normalize`: :func:`normalize` (NFKC, casefold,
  masks of e-mails, URLs, UUIDs, dates, ids and numbers, punctuation, spaces)
  and :func:`char_ngrams`.
* :mod:`~rag_ablate.dataset.grouping.join`: the similarity join of normalised texts,
  exact character n-gram Jaccard (prefix filtering) for up to ``exact_limit``
  distinct texts, MinHash-LSH with exact verification beyond, union-find.
* :mod:`~rag_ablate.dataset.grouping.groups`: :func:`group_near_duplicates` (explicit
  groups, group ids) and :class:`GroupingResult`.
* :mod:`~rag_ablate.dataset.grouping.splits`: :func:`assign_splits` (whole groups to
  dev/holdout towards ``holdout_share``, deterministic) and
  :func:`check_splits`.

"""

from __future__ import annotations
