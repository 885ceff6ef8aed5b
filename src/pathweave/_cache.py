"""The package's one cache type: a mapping of bounded size that drops the least recently used.

Every cache of derived data (a path set's planner tables, a fabric's path
sets, the telemetry's stream plans, ...) is a :class:`Cache`, so none grows
without bound and all evict the same way. Values are rebuilt on a miss, so a
dropped entry costs time, never a different result.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any, Generic, TypeVar

__all__ = ["Cache"]

V = TypeVar("V")


class Cache(Generic[V]):
    """At most ``size`` entries; when full, the least recently used one goes (a hit is a use).

    Parameters
    ----------
    size : int
        Most entries kept, at least 1.

    Examples
    --------
    >>> c = Cache(2)
    >>> c.get_or_build("a", lambda: 1), c.get_or_build("b", lambda: 2), c.get("a")
    (1, 2, 1)
    >>> c.put("c", 3)  # "b" is the least recently used
    >>> "b" in c, "a" in c, len(c)
    (False, True, 2)
    """

    __slots__ = ("_entries", "size")

    def __init__(self, size: int) -> None:
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"cache size must be a whole number >= 1, got {size!r}")
        self.size = size
        self._entries: OrderedDict[Hashable, V] = OrderedDict()

    @classmethod
    def on(cls, owner: Any, attr: str, size: int) -> Cache[Any]:
        """The cache kept in ``owner.__dict__[attr]``, made on first use.

        For immutable objects (a frozen :class:`~pathweave.fabric.PathSet`, a
        :class:`~pathweave.fabric.Fabric`) that keep derived data beside their
        fields; ``owner``'s equality and hash do not see it.
        """
        cache = owner.__dict__.get(attr)
        if cache is None:
            cache = owner.__dict__[attr] = cls(size)
        return cache  # type: ignore[no-any-return]

    def get(self, key: Hashable, default: Any = None) -> Any:
        """The value of ``key`` (now the most recently used), or ``default``."""
        try:
            value = self._entries[key]
        except KeyError:
            return default
        self._use(key)
        return value

    def _use(self, key: Hashable) -> None:
        # Threads share some caches (the executor's streams, a process's
        # groups); one may evict the key between another's read and its move.
        try:
            self._entries.move_to_end(key)
        except KeyError:
            pass

    def put(self, key: Hashable, value: V) -> None:
        """Keep ``value`` under ``key``, dropping the least recently used entry when full."""
        self._entries[key] = value
        self._use(key)
        while len(self._entries) > self.size:
            try:
                self._entries.popitem(last=False)
            except KeyError:  # another thread emptied it meanwhile
                break

    def get_or_build(self, key: Hashable, build: Callable[[], V]) -> V:
        """The value of ``key``; on a miss ``build()``'s, kept (nothing is kept if it raises)."""
        # NOTE: one look-up and the move on a hit, not three hash passes: an
        # 8-GPU default plan reads four kept tables (tuple keys hash anew each time).
        try:
            value = self._entries[key]
        except KeyError:
            pass
        else:
            self._use(key)
            return value
        value = build()
        self.put(key, value)
        return value

    def __contains__(self, key: Hashable) -> bool:
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def values(self) -> list[V]:
        """The values, least recently used first (reading them moves nothing)."""
        return list(self._entries.values())

    def __repr__(self) -> str:
        return f"Cache(size={self.size}, entries={len(self._entries)})"
