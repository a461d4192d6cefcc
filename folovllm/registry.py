"""A name -> implementation table filled by a decorator, so a new backend or policy is one class."""
from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """Implementations of one seam (attention backends, scheduling policies, ...) by name.

    Entries are added when their module is imported, by ``@registry.register("name")``.
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        """Class decorator: makes the class available under ``name``."""
        def add(entry: T) -> T:
            if name in self._entries:
                raise ValueError(f"{self.kind} {name!r} is registered twice")
            self._entries[name] = entry
            return entry

        return add

    def get(self, name: str) -> T:
        """The implementation registered as ``name``; ValueError listing the known names otherwise."""
        if name not in self._entries:
            raise ValueError(f"unknown {self.kind} {name!r}; supported: {sorted(self._entries)}")
        return self._entries[name]

    def names(self) -> list[str]:
        """Registered names, in registration order."""
        return list(self._entries)
