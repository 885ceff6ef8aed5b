"""Helpers every command shares: consoles, error reporting, number formatting."""

from __future__ import annotations

import functools
import json
import math
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn, ParamSpec, TypeVar

import typer
from rich.console import Console
from rich.markup import escape

from pathweave._files import atomic_write
from pathweave.errors import PathweaveError
from pathweave.plan import policies, policy_info

#: Exit code for bad input (an unknown policy, a malformed workload, ...);
#: typer uses the same code for malformed command lines.
EXIT_BAD_INPUT = 2

P = ParamSpec("P")
R = TypeVar("R")


def console(*, stderr: bool = False) -> Console:
    """A rich console bound to the current stdout or stderr.

    Built per call rather than once at import so that test runners which
    swap ``sys.stdout`` see the output. Off a terminal rich would fall back
    to 80 columns, which wraps the wider tables; 120 keeps them on one line
    in logs and captured output.
    """
    stream = sys.stderr if stderr else sys.stdout
    width = None if stream.isatty() else 120
    return Console(file=stream, width=width, highlight=False)


def fail(message: str, code: int = EXIT_BAD_INPUT) -> NoReturn:
    """Print ``error: message`` in red on stderr (one line) and exit with ``code``."""
    console(stderr=True).print(f"[bold red]error:[/] {escape(message)}", soft_wrap=True)
    raise typer.Exit(code)


@contextmanager
def user_errors(code: int = EXIT_BAD_INPUT) -> Iterator[None]:
    """Turn pathweave's own errors and file errors into one red line and an exit code.

    Anything else is a bug in pathweave and keeps its traceback.
    """
    try:
        yield
    except PathweaveError as exc:
        fail(str(exc), code)
    except OSError as exc:
        where = f"{exc.filename}: " if exc.filename else ""
        fail(f"{where}{exc.strerror or exc}", code)


def handles_user_errors(func: Callable[P, R]) -> Callable[P, R]:
    """Decorator form of :func:`user_errors` for command functions."""

    @functools.wraps(func)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        with user_errors():
            return func(*args, **kwargs)

    return wrapper


def parse_policies(text: str) -> list[str]:
    """Split ``"static,mwu"`` into registered policy names; ``all`` means every policy.

    Raises :class:`~pathweave.errors.PlanError` naming an unknown policy.
    """
    names: list[str] = []
    for item in text.split(","):
        name = item.strip()
        if not name:
            continue
        for n in policies() if name == "all" else [name]:
            policy_info(n)  # raises, naming the policy and listing the known ones
            if n not in names:
                names.append(n)
    if not names:
        fail(f"--policy {text!r} names no policy; known policies: {', '.join(policies())}")
    return names


def ordered_policies(names: Sequence[str] | None = None) -> list[str]:
    """Policies in registry order with ``optimal`` last: the yardstick closes a table."""
    names = list(policies() if names is None else names)
    return [n for n in names if n != "optimal"] + (["optimal"] if "optimal" in names else [])


def fmt_ms(seconds: float | None, digits: int = 3) -> str:
    """Seconds as milliseconds with ``digits`` decimals; ``n/a`` for ``None``."""
    if seconds is None or not math.isfinite(seconds):
        return "n/a"
    return f"{seconds * 1e3:.{digits}f}"


def fmt_duration(seconds: float | None) -> str:
    """A duration in the unit that keeps three significant digits: ``42.1 us``, ``3.20 s``."""
    if seconds is None or not math.isfinite(seconds):
        return "n/a"
    value, unit = seconds / 1e-9, "ns"
    for scale, name in ((1.0, "s"), (1e-3, "ms"), (1e-6, "us")):
        if seconds >= scale:
            value, unit = seconds / scale, name
            break
    digits = 0 if value >= 100 else 1 if value >= 10 else 2
    return f"{value:.{digits}f} {unit}"


def fmt_ratio(value: float | None) -> str:
    return "n/a" if value is None or not math.isfinite(value) else f"{value:.3f}x"


def fmt_bytes(nbytes: float) -> str:
    """Binary units, as the ``--bytes`` option reads them: ``256 MiB``."""
    value = float(nbytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            break
        value /= 1024
    return f"{value:.0f} {unit}" if value == int(value) else f"{value:.2f} {unit}"


def write_json(path: Path, data: Any) -> None:
    """Write ``data`` as indented JSON, atomically, creating parent folders."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, (json.dumps(data, indent=2) + "\n").encode())
