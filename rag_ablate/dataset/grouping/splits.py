"""Group-aware dev/holdout split assignment.

:func:`assign_splits` places whole groups, largest first, each into the split
that is further below its target (by filled fraction); equal sizes are ordered
by a seeded hash of the group id, ties of the fill fractions are broken by that
hash too. Interleaving large groups (instead of filling the holdout with the
largest ones first) keeps both splits alike in composition, and the many small
groups at the end bring the share to within a group of the target.
:func:`check_splits` names the groups that a given assignment splits.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence

from rag_ablate.core.errors import ConfigError, DatasetError

__all__ = ["assign_splits", "check_splits"]

_SPLITS = ("dev", "holdout")


def _tie_key(seed: int) -> Callable[[str], bytes]:
    prefix = f"{seed}\x1f".encode()

    def key(group: str) -> bytes:
        return hashlib.blake2b(prefix + group.encode("utf-8", "surrogatepass"), digest_size=8).digest()

    return key


def assign_splits(
    group_of: Sequence[str],
    *,
    holdout_share: float = 0.3,
    seed: int = 0,
    fixed: Sequence[str | None] | None = None,
) -> list[str]:
    """``"dev"`` or ``"holdout"`` per item, never splitting a group.

    Groups with a fixed split (any member's ``fixed`` value) go there first,
    with all their members. The other groups follow, largest first (equal
    sizes in the order of a hash of ``seed`` and the group id), each into the
    split whose count is the smaller fraction of its target
    (``holdout_share * n`` and the rest); an exact tie goes by that hash.
    Deterministic for equal inputs.

    Raises DatasetError when ``fixed`` holds a value other than dev/holdout,
    or puts members of one group into both splits.
    """
    if not 0.0 <= holdout_share <= 1.0:
        raise ConfigError(f"holdout_share must be in [0, 1], got {holdout_share}")
    count = len(group_of)
    if fixed is not None and len(fixed) != count:
        raise ValueError(f"{len(fixed)} fixed splits for {count} items")
    sizes: dict[str, int] = {}
    for g in group_of:
        sizes[g] = sizes.get(g, 0) + 1
    placed: dict[str, str] = {}
    where: dict[str, int] = {}
    if fixed is not None:
        for i, (g, s) in enumerate(zip(group_of, fixed, strict=True)):
            if s is None:
                continue
            if s not in _SPLITS:
                raise DatasetError(f"item {i}: split must be 'dev' or 'holdout', got {s!r}", field="split")
            prev = placed.get(g)
            if prev is not None and prev != s:
                raise DatasetError(
                    f"group '{g}' is fixed to both splits: item {where[g]} is '{prev}', item {i} is '{s}'",
                    field="split",
                )
            placed.setdefault(g, s)
            where.setdefault(g, i)
    holdout = sum(sizes[g] for g, s in placed.items() if s == "holdout")
    dev = sum(sizes[g] for g, s in placed.items() if s == "dev")
    target_h = holdout_share * count
    target_d = count - target_h
    tie = _tie_key(seed)
    free = sorted((g for g in sizes if g not in placed), key=lambda g: (-sizes[g], tie(g)))
    for g in free:
        if target_h <= 0:
            split = "dev"
        elif target_d <= 0:
            split = "holdout"
        else:
            fill_h, fill_d = holdout / target_h, dev / target_d
            if fill_h == fill_d:
                split = "holdout" if tie(g)[0] & 1 else "dev"
            else:
                split = "holdout" if fill_h < fill_d else "dev"
        placed[g] = split
        if split == "holdout":
            holdout += sizes[g]
        else:
            dev += sizes[g]
    return [placed[g] for g in group_of]


def check_splits(group_of: Sequence[str], split_of: Sequence[str]) -> list[str]:
    """Ids of the groups whose items are in more than one split, sorted."""
    if len(group_of) != len(split_of):
        raise ValueError(f"{len(split_of)} splits for {len(group_of)} items")
    seen: dict[str, str] = {}
    bad: set[str] = set()
    for g, s in zip(group_of, split_of, strict=True):
        if seen.setdefault(g, s) != s:
            bad.add(g)
    return sorted(bad)
