"""The one grammar of spec strings (fabric presets, workloads, topology files).

Grammar (whitespace around tokens is ignored)::

    spec   := head [ ":" items ]
    items  := item ( "," item )*
    item   := key "=" VALUE | VALUE      (a bare VALUE only first, where allowed)

Each key may appear once (after the caller's aliases are resolved); an empty
item, an empty key or value, or a ``:`` with nothing after it is an error.
What the keys mean and how their values are typed is the caller's business;
the value parsers here (:func:`number`, :func:`integer`, :func:`boolean`)
give every layer the same reading of a number. Errors are raised as the
caller's own error class and name the spec, the key and the text.

Examples
--------
>>> from pathweave._spec import items, split
>>> split("dgx-h100:nodes=4, spines=2", "fabric spec")
('dgx-h100', 'nodes=4, spines=2')
>>> items("nodes=4, spines=2", where="fabric spec", error=ValueError)
[('nodes', 'nodes', '4'), ('spines', 'spines', '2')]
>>> items("0.8", where="workload spec", error=ValueError, positional="ratio")
[('ratio', None, '0.8')]
>>> items("a=1,a=2", where="spec 'x:a=1,a=2'", error=ValueError)
Traceback (most recent call last):
...
ValueError: spec 'x:a=1,a=2': a given twice
"""

from __future__ import annotations

import math
from collections.abc import Callable

#: ``(canonical key, key as written or None for a bare value, value text)``
Item = tuple[str, "str | None", str]

_TRUE = {"true", "yes", "on", "1"}
_FALSE = {"false", "no", "off", "0"}


def split(spec: str, label: str) -> tuple[str, str | None]:
    """``(head, rest)`` of ``spec``, both stripped; ``rest`` is None without a ``:``.

    Raises
    ------
    TypeError
        ``spec`` is not a string (``label`` names what it should be).
    """
    if not isinstance(spec, str):
        raise TypeError(f"a {label} must be a string, got {type(spec).__name__} {spec!r}")
    head, sep, rest = spec.strip().partition(":")
    return head.strip(), (rest.strip() if sep else None)


def items(
    text: str | None,
    *,
    where: str,
    error: type[Exception],
    canonical: Callable[[str], str] = lambda key: key,
    positional: str | None = None,
    hint: str = "",
) -> list[Item]:
    """The items of ``text``, what follows the ``:`` (None: no ``:``, no items).

    Parameters
    ----------
    text
        The items, from :func:`split`.
    where
        Leads every message (``"fabric spec 'node.xml:nodes=x'"``).
    error
        Raised for text that breaks the grammar.
    canonical
        Maps a key as written (stripped) to the key it sets (aliases, case);
        two items with one canonical key are an error.
    positional
        The key a bare first value sets; ``None`` refuses bare values.
    hint
        Appended to the message about a misplaced or refused bare value
        (e.g. the valid keys).

    Returns
    -------
    list of Item
        One :data:`Item` per item, in the order written.

    Raises
    ------
    error
        On a grammar error, naming ``where`` and the item.
    """
    if text is None:
        return []
    if not text.strip():
        raise error(f"{where} has nothing after ':'")
    found: list[Item] = []
    for index, item in enumerate(part.strip() for part in text.split(",")):
        if item == "":
            raise error(f"{where} has an empty item")
        key, eq, value = (part.strip() for part in item.partition("="))
        if not eq:
            if positional is None:
                raise error(f"{where}: expected key=value, got {item!r}{hint}")
            if index != 0:
                raise error(f"{where}: bare value {item!r} must come first{hint}")
            name, key, value = positional, None, item
        elif not key:
            raise error(f"{where}: item {item!r} has no key")
        else:
            name = canonical(key)
        if value == "":
            raise error(f"{where}: {key} has an empty value")
        if any(name == seen for seen, _, _ in found):
            raise error(f"{where}: {name} given twice")
        found.append((name, key, value))
    return found


def number(text: str, where: str, error: type[Exception]) -> float:
    """``text`` as a finite float; ``where`` (``"spec 'x': key='y'"``) leads the message."""
    try:
        value = float(text)
    except ValueError:
        raise error(f"{where} is not a number") from None
    if not math.isfinite(value):
        raise error(f"{where} is not a finite number")
    return value


def integer(text: str, where: str, error: type[Exception]) -> int:
    """``text`` as an int; integral floats such as ``1e4`` or ``16.0`` are accepted."""
    try:
        return int(text, 10)
    except ValueError:
        pass
    value = number(text, where, error)
    if not value.is_integer():
        raise error(f"{where} is not an integer")
    return int(value)


def boolean(text: str, where: str, error: type[Exception]) -> bool:
    """``text`` as a bool: true/yes/on/1 or false/no/off/0, any case."""
    lowered = text.lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise error(f"{where} is not a boolean (true/false)")


__all__ = ["Item", "boolean", "integer", "items", "number", "split"]
