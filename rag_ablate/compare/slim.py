"""Records as the comparison keeps them (:func:`slim_record`), and reading a records file that way,
whole or in pieces, in this process or in a worker process (:func:`read_slim`, :class:`SlimFile`,
:func:`start_worker`).

This module imports only what reading needs (no numpy, no config), so a worker process started
with ``python -c`` is ready in a fraction of a second: :mod:`rag_ablate.compare.load` reads a
sweep's records files side by side, cut into pieces between this process and worker processes,
when they are large.
"""

from __future__ import annotations

import gc
import hashlib
import math
import os
import pickle
import subprocess
import sys
from array import array
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import IO, Any, cast

from rag_ablate.core.errors import RagAblateError
from rag_ablate.records.jsonl import dumps_sorted, gc_paused, read_records, scan_records
from rag_ablate.records.trace import Record


class _NoEntry(Mapping[str, Any]):
    """An empty read-only mapping, one for the whole process (pickled by name: a worker's records
    hold the same object once read back)."""

    def __getitem__(self, key: str) -> Any:
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0

    def __repr__(self) -> str:
        return "NO_ENTRY"

    def __reduce__(self) -> str:
        return "NO_ENTRY"


#: what a record's retrieved entries become once read for the comparison (see :func:`slim_record`)
NO_ENTRY: Mapping[str, Any] = _NoEntry()


def _outputs(rec: Record) -> bytes:
    """A digest of what the system returned for one query: its status, retrieved chunk ids,
    answer, intents and citations (timings, scores and metrics left out)."""
    retrieved = [(e.get("doc_id"), e.get("chunk_id")) for e in rec.get("retrieved") or []]
    kept = [rec.get("status"), retrieved, rec.get("answer"), rec.get("intent_pred"), rec.get("intents")]
    return hashlib.blake2b(dumps_sorted([*kept, rec.get("citations")]), digest_size=16).digest()


#: record fields whose values (strings, or lists of strings) repeat from query to query
REPEATED_FIELDS = (
    "split",
    "status",
    "kind",
    "intent_gold",
    "intent_gold_l1",
    "intent_pred",
    "tags",
    "intents",
)
#: record fields holding a mapping of names to numbers (shared names, shared float objects)
NUMBER_FIELDS = ("metrics", "timings_ms")
#: how many distinct floats a load shares at most (the discrete values of ranked-list metrics come
#: first; continuous ones, latencies, fill the table and are then kept as they come)
SHARED_FLOATS = 1 << 16
_ZERO, _ONE = 0.0, 1.0


@dataclass(frozen=True)
class _Plan:
    """How to slim a record with one key order: its shared key names and the positions of the
    fields :meth:`_Slimmer.__call__` rewrites."""

    keys: tuple[str, ...]
    repeated: tuple[int, ...]
    numbers: tuple[int, ...]
    retrieved: int  # -1: none


class _Slimmer:
    """:func:`slim_record` with one table of interned names and floats shared by every record of a
    load; it also keeps a digest of each query's outputs (:meth:`outputs`), read before they are
    slimmed."""

    def __init__(self) -> None:
        self.names: dict[str, str] = {}
        self.key_sets: dict[tuple[str, ...], tuple[str, ...]] = {}  # a dict's keys -> the shared names
        self.plans: dict[tuple[str, ...], _Plan] = {}
        self.floats: dict[float, float] = {_ONE: _ONE}  # 0.0 apart: it equals -0.0 (see _numbers)
        self.digests: dict[str, bytes] = {}

    def outputs(self) -> str:
        """One fingerprint of every query's outputs (the last record of each query counts). The
        ids are sorted alone: sorting the items made a tuple each, and the collector's full
        collections they set off walked every record read (0.5 s of CPU a file at 100,000
        queries)."""
        h = hashlib.blake2b(digest_size=16)
        digests = self.digests
        for query_id in sorted(digests):
            h.update(query_id.encode("utf-8") + b"\0" + digests[query_id])
        return h.hexdigest()

    def _names_of(self, keys: tuple[str, ...]) -> tuple[str, ...]:
        """``keys`` as the shared names (records repeat the same key sets: each set is looked up
        once as a tuple)."""
        shared = self.key_sets.get(keys)
        if shared is None:
            shared = self.key_sets[keys] = tuple(self.names.setdefault(k, k) for k in keys)
        return shared

    def _plan(self, keys: tuple[str, ...]) -> _Plan:
        plan = self.plans[keys] = _Plan(
            self._names_of(keys),
            tuple(i for i, k in enumerate(keys) if k in REPEATED_FIELDS),
            tuple(i for i, k in enumerate(keys) if k in NUMBER_FIELDS),
            keys.index("retrieved") if "retrieved" in keys else -1,
        )
        return plan

    def _numbers(self, d: dict[str, Any]) -> dict[str, Any]:
        """A mapping of names to numbers with shared names and one float object per distinct value
        (0.0 and 1.0, most values of 0/1 metrics, and the first :data:`SHARED_FLOATS` others): a
        new dict, built from the items (the parser's dicts hold spare room, a third of their size).
        The values are equal, only shared; -0.0 keeps its sign (it equals 0.0, so zeros are never
        looked up in the table)."""
        return dict(zip(self._names_of(tuple(d)), self.shared(d.values()), strict=True))

    def shared(self, values: Iterable[Any]) -> list[Any]:
        """``values`` with each float the table's equal one (see :meth:`_numbers`)."""
        floats = self.floats
        share = floats.setdefault if len(floats) < SHARED_FLOATS else floats.get
        return [
            (share(x, x) if x else _ZERO if math.copysign(1.0, x) > 0 else x) if type(x) is float else x
            for x in values
        ]

    def __call__(self, rec: Record) -> Record:
        self.digests[str(rec.get("query_id"))] = _outputs(rec)
        keys = tuple(rec)
        plan = self.plans.get(keys) or self._plan(keys)
        values = list(rec.values())
        names = self.names
        for i in plan.repeated:  # one string per distinct value of the fields that repeat
            v = values[i]
            if type(v) is str:
                values[i] = names.setdefault(v, v)
            elif type(v) is list:
                values[i] = [names.setdefault(x, x) if type(x) is str else x for x in v]
        for i in plan.numbers:
            v = values[i]
            if type(v) is dict:
                values[i] = self._numbers(v)
        retrieved = values[plan.retrieved] if plan.retrieved >= 0 else None
        if isinstance(retrieved, list):
            values[plan.retrieved] = (NO_ENTRY,) * len(retrieved)
        # a new dict, even where the parser shared the names already (orjson does): see _numbers.
        # Typed as a Record although ``retrieved`` now holds empty entries: the comparison reads
        # its length only (see slim_record)
        return cast(Record, dict(zip(plan.keys, values, strict=True)))


def slim_record(rec: Record) -> Record:
    """A record as the comparison keeps it: every field, but ``retrieved`` keeps only its length
    (each entry an empty read-only mapping; the comparison, the trade-off and the report read
    the list's length, never its entries), and field and metric names are shared between
    records. At 100,000 queries this halves what a variant's records take in memory."""
    return _Slimmer()(rec)


def read_slim(path: Path) -> tuple[list[Record], str]:
    """Every record of a records file as :func:`slim_record` keeps it, and the fingerprint of
    the queries' outputs (``VariantData.outputs``)."""
    slimmer = _Slimmer()
    records = read_records(path, slimmer)
    return records, slimmer.outputs()


@dataclass(frozen=True)
class Piece:
    """The lines of a records file from byte ``start`` to byte ``end`` (line boundaries, see
    :func:`line_boundary`): a file is read in pieces side by side (:class:`SlimFile`)."""

    path: Path
    start: int
    end: int


def line_boundary(path: Path, offset: int) -> int:
    """The first line boundary of ``path`` at or after byte ``offset`` (where a line starts, or the
    file's end)."""
    if offset <= 0:
        return 0
    pos = offset - 1  # a line starts at offset when the byte before it is a newline
    with path.open("rb") as f:
        f.seek(pos)
        while block := f.read(1 << 16):
            i = block.find(b"\n")
            if i >= 0:
                return pos + i + 1
            pos += len(block)
    return pos


@dataclass(frozen=True)
class Packed:
    """A piece's records as a worker process sends them (:func:`pack`): each dict of
    :data:`NUMBER_FIELDS` taken out (None in its place) and sent as columns, its key set's number in
    ``shapes`` (one a record and field, 0: not a dict, left as it was) and its values' numbers in
    ``codes``, into ``values`` (each value object once): a few arrays instead of 40 floats a record,
    which this process would unpickle one by one and then share again. ``digests``: each query's
    outputs (``_Slimmer.digests``)."""

    records: list[Record]
    key_sets: list[tuple[str, ...]]
    shapes: array[int]
    codes: array[int]
    values: list[Any]
    digests: dict[str, bytes]


def pack(records: list[Record], digests: dict[str, bytes]) -> Packed:
    """``records`` as :class:`Packed` (their number fields taken out, in place)."""
    key_sets: dict[tuple[str, ...], int] = {}
    shapes, codes = array("I"), array("I")
    values: list[Any] = []
    number: dict[int, int] = {}  # a value object's id -> its place in values (the records hold them)
    for rec in records:
        for k in NUMBER_FIELDS:
            d = rec.get(k)
            if type(d) is not dict:
                shapes.append(0)
                continue
            shapes.append(key_sets.setdefault(tuple(d), len(key_sets) + 1))
            for x in d.values():
                code = number.get(id(x))
                if code is None:
                    code = number[id(x)] = len(values)
                    values.append(x)
                codes.append(code)
            rec[k] = None  # type: ignore[literal-required]
    return Packed(records, list(key_sets), shapes, codes, values, digests)


def read_piece(piece: Piece) -> Packed:
    """A piece's records as :func:`read_slim` keeps them, packed for sending, and its queries'
    output digests."""
    slimmer = _Slimmer()
    return pack(scan_records(piece.path, slimmer, piece.start, piece.end).records, slimmer.digests)


class SlimFile:
    """A records file read piece by piece, in file order, here (:meth:`read`) or in a worker
    process (:meth:`take`): the records and fingerprint :func:`read_slim` gives (:meth:`result`),
    names shared within each piece, floats across the file."""

    def __init__(self) -> None:
        self._slimmer = _Slimmer()
        self._records: list[Record] = []

    def read(self, piece: Piece) -> None:
        self._records += scan_records(piece.path, self._slimmer, piece.start, piece.end).records

    def take(self, got: Packed) -> None:
        """A piece a worker read, its number fields put back (their names and floats shared with
        the file's other pieces)."""
        slimmer = self._slimmer
        slimmer.digests.update(got.digests)  # a later piece's record of a query counts
        key_sets = [slimmer._names_of(keys) for keys in got.key_sets]
        table: list[Any] = []
        for i in range(0, len(got.values), 1 << 12):  # a chunk at a time: the table's size limit
            table += slimmer.shared(got.values[i : i + (1 << 12)])
        values, shapes = map(table.__getitem__, got.codes), iter(got.shapes)
        with gc_paused():  # a dict a record and field: each full collection would walk every record
            for rec in got.records:
                for k in NUMBER_FIELDS:
                    shape = next(shapes)
                    if shape:
                        keys = key_sets[shape - 1]
                        rec[k] = dict(zip(keys, islice(values, len(keys)), strict=True))  # type: ignore[literal-required]
        self._records += got.records

    def result(self) -> tuple[list[Record], str]:
        return self._records, self._slimmer.outputs()


def start_worker(pieces: Sequence[Piece]) -> subprocess.Popen[bytes]:
    """A process reading ``pieces`` one after another by :func:`read_piece` that writes each result,
    pickled, to its stdout once it has read them all (this process takes them once it has read its
    own: a worker writing as it goes would wait for it), or the RagAblateError it met, and stops;
    read them back with :func:`worker_results`."""
    root = str(Path(__file__).resolve().parents[2])  # this very package, whatever the cwd
    code = f"import sys; sys.path.insert(0, {root!r}); from rag_ablate.compare.slim import _work; _work()"
    args = [str(x) for p in pieces for x in (p.path, p.start, p.end)]
    return subprocess.Popen(
        [sys.executable, "-I", "-c", code, *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )


def worker_results(proc: subprocess.Popen[bytes], n: int) -> list[Packed | None]:
    """What :func:`start_worker`'s process read from its ``n`` pieces, in order; None for a piece it
    did not finish (read it in this process instead: its error, if any, is raised there). A
    RagAblateError it met is raised."""
    out: list[Packed | None] = []
    try:
        with gc_paused():
            while len(out) < n:
                got = pickle.load(cast(IO[bytes], proc.stdout))
                if isinstance(got, RagAblateError):
                    raise got
                out.append(got)
    except RagAblateError:
        raise
    except Exception:  # a worker killed or failing: the caller reads what is left itself
        pass
    finally:
        cast(IO[bytes], proc.stdout).close()
        proc.wait()
    return out + [None] * (n - len(out))


def _work() -> None:
    """A worker process's body (see :func:`start_worker`): each piece's result pickled as soon as
    it is read (the bytes take a sixth of the records' memory), written once all are read."""
    gc.disable()  # records are acyclic (see gc_paused), and this process ends once they are sent
    args = sys.argv[1:]
    done: list[bytes] = []
    for i in range(0, len(args), 3):
        try:
            result: object = read_piece(Piece(Path(args[i]), int(args[i + 1]), int(args[i + 2])))
        except RagAblateError as exc:
            done.append(pickle.dumps(exc, protocol=pickle.HIGHEST_PROTOCOL))
            break
        done.append(pickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL))
        del result  # its records, before the next piece's
    with os.fdopen(sys.stdout.fileno(), "wb", closefd=False) as out:
        for blob in done:
            out.write(blob)
