"""The package's one registry type: named entries in order, refused twice, found by name.

Every plug-in table (planner policies, simulator policies, fabric presets,
workloads, paper figures) is a :class:`Registry`, so each registers, lists
and fails to find a name the same way: a duplicate name is refused, an
unknown one raises the registry's own error naming it, the closest known
name and every known one. Entry modules may be declared and imported only
when the registry is first read, so a new entry is one new file.
"""

from __future__ import annotations

import difflib
import importlib
import pkgutil
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

from pathweave.errors import InputError

__all__ = ["Registry", "did_you_mean"]

T = TypeVar("T")
E = TypeVar("E")
D = TypeVar("D")


def did_you_mean(given: str, valid: Sequence[str]) -> str:
    """`` (did you mean 'x'?)`` for the closest of ``valid`` to ``given``, else ``""``.

    ``-`` and ``_`` count as the same, as they do in spec names.

    >>> did_you_mean("dgx_h100", ["h100-2x4", "dgx-h100"])
    " (did you mean 'dgx-h100'?)"
    >>> did_you_mean("zzz", ["uniform"])
    ''
    """
    folded = {v.replace("_", "-").lower(): v for v in valid}
    close = difflib.get_close_matches(given.replace("_", "-").lower(), list(folded), n=1)
    return f" (did you mean {folded[close[0]]!r}?)" if close else ""


class Registry(Mapping[str, T]):
    """Named entries, listed in a fixed order; a read-only mapping of name -> entry.

    Parameters
    ----------
    what : str
        What one entry is, for messages (``"policy"``, ``"fabric preset"``).
    plural : str, optional
        The entries in the error's list (default ``what + "s"``).
    error : type of Exception
        Raised for a duplicate or an unknown name (one of :mod:`pathweave.errors`).
    modules : sequence of str
        Entry modules, imported in this order when the registry is first
        read (never when an entry is added). Entries list in the order of
        their module here, then in the order they were added; an entry of a
        module not named lists after them.
    package : str, optional
        A package whose every module (sorted by name) is an entry module, after ``modules``.

    Examples
    --------
    >>> from pathweave.errors import PlanError
    >>> colours = Registry("colour", error=PlanError)
    >>> colours.add("red", 0xF00)
    3840
    >>> @colours.register("blue")
    ... def blue():
    ...     return 0x00F
    >>> list(colours), colours["red"], "blue" in colours
    (['red', 'blue'], 3840, True)
    >>> colours["rde"]
    Traceback (most recent call last):
    ...
    pathweave.errors.PlanError: unknown colour 'rde' (did you mean 'red'?); known colours: red, blue
    >>> colours.add("red", 1)
    Traceback (most recent call last):
    ...
    pathweave.errors.PlanError: colour 'red' is already registered
    """

    __slots__ = (
        "_derived",
        "_entries",
        "_loaded",
        "_loading",
        "_lock",
        "_modules",
        "_order",
        "_package",
        "error",
        "plural",
        "what",
    )

    def __init__(self, what: str, *, plural: str | None = None,
                 error: type[Exception] = InputError, modules: Sequence[str] = (),
                 package: str | None = None) -> None:
        self.what = what
        self.plural = plural or what + "s"
        self.error = error
        self._modules = tuple(modules)
        self._package = package
        self._loaded = not self._modules and package is None
        self._loading = False
        # Another thread waits for the entry modules; the loading thread itself
        # (an entry module reading the registry) sees what is there so far.
        self._lock = threading.RLock()
        self._entries: dict[str, T] = {}
        # name -> the entry's module, for the listing order.
        self._order: dict[str, str | None] = {}
        # What is derived from the entries (the listing, a planner's baselines),
        # kept until an entry is added: planners list candidates per call.
        self._derived: dict[Any, Any] = {}

    # ------------------------------------------------------------ adding
    def add(self, name: str, entry: E, *, module: str | None = None) -> E:
        """Register ``entry`` under ``name`` and return it.

        ``module``: where the entry is defined, for the listing order (see
        ``modules``). The same entry added again under its name is kept once
        (a module imported twice); another entry under a taken name raises.
        """
        if not isinstance(name, str) or not name:
            raise self.error(f"a {self.what} name must be a non-empty string, got {name!r}")
        if name in self._entries:
            if self._entries[name] is entry:
                return entry
            raise self.error(f"{self.what} {name!r} is already registered")
        self._entries[name] = entry  # type: ignore[assignment]
        self._order[name] = module
        self._derived.clear()
        return entry

    def register(self, name: str) -> Callable[[E], E]:
        """Decorator: ``add(name, obj, module=obj.__module__)``, returning ``obj`` unchanged."""

        def deco(obj: E) -> E:
            return self.add(name, obj, module=getattr(obj, "__module__", None))

        return deco

    # ------------------------------------------------------------ reading
    def load(self) -> None:
        """Import the entry modules (once; a module that fails to import raises each time)."""
        if self._loaded:
            return
        with self._lock:
            if self._loaded or self._loading:
                return
            self._loading = True
            try:
                for mod in self._all_modules():
                    importlib.import_module(mod)
            finally:
                self._loading = False
            self._loaded = True

    def _all_modules(self) -> list[str]:
        mods = list(self._modules)
        if self._package is not None:
            pkg = importlib.import_module(self._package)
            mods += [f"{self._package}.{m.name}"
                     for m in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda m: m.name)]
        return mods

    def names(self) -> list[str]:
        """Every name, in order (see ``modules``)."""
        def listing() -> tuple[str, ...]:
            rank = {m: i for i, m in enumerate(self._modules)}
            seq = {n: i for i, n in enumerate(self._entries)}
            return tuple(sorted(
                self._entries, key=lambda n: (rank.get(self._order[n] or "", len(rank)), seq[n])))

        return list(self.derived("names", listing))

    def derived(self, key: Any, build: Callable[[], D]) -> D:
        """``build()``'s value, computed once and kept until an entry is added.

        For what callers derive from the entries on every call (a planner's
        baselines): ``build`` must read nothing but the registry.
        """
        self.load()
        if key not in self._derived:
            self._derived[key] = build()
        return self._derived[key]  # type: ignore[no-any-return]

    def __getitem__(self, name: str) -> T:
        self.load()
        try:
            return self._entries[name]
        except (KeyError, TypeError):  # TypeError: an unhashable name
            raise self.unknown(name) from None

    def unknown(self, name: Any) -> Exception:
        """The error for ``name``, not registered: the closest name and every known one."""
        known = self.names()
        hint = did_you_mean(name, known) if isinstance(name, str) else ""
        return self.error(f"unknown {self.what} {name!r}{hint}; known {self.plural}: "
                          f"{', '.join(known)}")

    def suggest(self, name: str) -> str:
        """`` (did you mean 'x'?)`` for the closest registered name to ``name``, else ``""``."""
        return did_you_mean(name, self.names())

    def get(self, name: str, default: Any = None) -> Any:
        """The entry ``name``, or ``default`` when none is registered."""
        self.load()
        try:
            return self._entries.get(name, default)
        except TypeError:
            return default

    def __contains__(self, name: object) -> bool:
        self.load()
        try:
            return name in self._entries
        except TypeError:
            return False

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        self.load()
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.what!r}: {', '.join(self.names())})"
