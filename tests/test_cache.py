"""pathweave._cache.Cache, the package's one cache type, and the caches built on it."""

from __future__ import annotations

import random
from collections import OrderedDict

import pytest

import pathweave as pw
from pathweave._cache import Cache
from pathweave.fabric import paths as fabric_paths


def _reference_lru(size: int, ops: list[tuple[str, int]]) -> list[object]:
    """The obvious model: a list of keys, most recently used last, and a dict of values."""
    order: list[int] = []
    values: dict[int, int] = {}
    seen: list[object] = []
    for op, key in ops:
        if op == "get":
            if key in values:
                order.remove(key)
                order.append(key)
            seen.append(values.get(key))
        else:  # put key * 10
            if key in values:
                order.remove(key)
            order.append(key)
            values[key] = key * 10
            while len(order) > size:
                del values[order.pop(0)]
        seen.append(sorted(values))
    return seen


@pytest.mark.parametrize("size", [1, 2, 5])
def test_cache_evicts_the_least_recently_used_like_the_reference(size: int) -> None:
    rng = random.Random(size)
    ops = [(rng.choice(["get", "put"]), rng.randrange(8)) for _ in range(400)]
    cache: Cache[int] = Cache(size)
    seen: list[object] = []
    for op, key in ops:
        if op == "get":
            seen.append(cache.get(key))
        else:
            cache.put(key, key * 10)
        seen.append(sorted(k for k in range(8) if k in cache))
    assert seen == _reference_lru(size, ops)
    assert len(cache) == min(size, len({k for op, k in ops if op == "put"}))


def test_get_or_build_builds_once_and_keeps_nothing_when_build_raises() -> None:
    cache: Cache[list[int]] = Cache(3)
    calls: list[str] = []
    first = cache.get_or_build("a", lambda: calls.append("a") or [1])
    assert cache.get_or_build("a", lambda: calls.append("again") or [2]) is first
    assert calls == ["a"]

    def boom() -> list[int]:
        raise RuntimeError("no")

    with pytest.raises(RuntimeError):
        cache.get_or_build("b", boom)
    assert "b" not in cache and len(cache) == 1


@pytest.mark.parametrize("size", [0, -1, 1.5, True, "3"])
def test_bad_size_is_named(size: object) -> None:
    with pytest.raises(ValueError, match=repr(size).replace(".", r"\.")):
        Cache(size)  # type: ignore[arg-type]


def test_path_set_derived_tables_are_bounded() -> None:
    paths = pw.fabric.candidate_paths(pw.fabric.preset("h100-2x4"))
    builds: list[int] = []
    n = fabric_paths.DERIVED_ENTRIES
    for i in range(n + 1):
        paths.derived(("test", i), lambda i=i: builds.append(i) or i)
    assert builds == list(range(n + 1))
    # key 0 was the least recently used: it went and is built again; key n stayed
    assert paths.derived(("test", n), lambda: -1) == n
    assert paths.derived(("test", 0), lambda: -1) == -1


def test_fabric_keeps_its_path_sets_once_per_rule_set() -> None:
    fab = pw.fabric.preset("h100-2x4")
    a = pw.fabric.candidate_paths(fab)
    assert pw.fabric.candidate_paths(fab, kinds=("rail", "spine", "relay", "direct")) is a
    b = pw.fabric.candidate_paths(fab, kinds=("direct", "rail"))
    assert b is not a and b.num_paths < a.num_paths
    assert len(fabric_paths.fabric_path_cache(fab)) == 2


class _Racing(OrderedDict):
    """Entries whose every move finds its key gone: another thread evicted it between the
    cache's read of the key and the move to most recently used that follows."""

    def move_to_end(self, key: object, last: bool = True) -> None:
        self.pop(key)
        super().move_to_end(key, last)


@pytest.mark.parametrize("read", ["get", "get_or_build"])
def test_a_key_evicted_between_read_and_move_still_returns_its_value(read: str) -> None:
    cache: Cache[int] = Cache(4)
    cache.put("k", 5)
    cache._entries = _Racing(cache._entries)
    got = cache.get("k") if read == "get" else cache.get_or_build("k", lambda: 7)
    assert got == 5 and "k" not in cache
