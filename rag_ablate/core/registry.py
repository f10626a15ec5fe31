"""One registry pattern for every pluggable kind.

Systems under test, retrievers, fusions, rerankers, encoders, routers, importers
and metrics are each listed in a :class:`Registry` under a name. Code asks the
registry for a name; an unknown name raises
:class:`~rag_ablate.core.errors.UnknownNameError`, whose message lists every valid
name. Adding a kind of thing means writing its module and one ``register`` call
(usually as a decorator) in that module; nothing else branches on the name.

Registries are filled when their modules are imported. Each registry knows the
modules that fill it (``providers``), so asking it for names imports them first:
checking a name never depends on what happened to be imported before.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from rag_ablate.core.errors import UnknownNameError

T = TypeVar("T")


class Registry(Generic[T]):
    """Named entries of one kind (``kind`` is used in error messages)."""

    def __init__(self, kind: str, providers: tuple[str, ...] = ()) -> None:
        self.kind = kind
        self._providers = providers
        self._loaded = not providers
        self._entries: dict[str, T] = {}

    def _load(self) -> None:
        if not self._loaded:
            self._loaded = True
            for module in self._providers:
                importlib.import_module(module)

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator: ``@RETRIEVERS.register("bm25")``. A name is registered once."""

        def add(obj: T) -> T:
            self.add(name, obj)
            return obj

        return add

    def add(self, name: str, obj: T) -> None:
        if name in self._entries and self._entries[name] is not obj:
            raise ValueError(f"{self.kind} '{name}' is registered twice")
        self._entries[name] = obj

    def get(self, name: str) -> T:
        self._load()
        try:
            return self._entries[name]
        except KeyError:
            raise UnknownNameError(self.kind, name, self._entries) from None

    def check(self, name: str) -> None:
        """Raise :class:`UnknownNameError` unless ``name`` is registered."""
        self.get(name)

    def names(self) -> tuple[str, ...]:
        self._load()
        return tuple(self._entries)

    def __contains__(self, name: object) -> bool:
        self._load()
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self.names())
