"""Helpers every command shares: consoles, error reporting, output paths, number formatting."""

from __future__ import annotations

import functools
import json
import math
import sys
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn, ParamSpec, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from typer._click.exceptions import ClickException, NoArgsIsHelpError
from typer.core import TyperGroup

from pathweave._files import IMAGE_SUFFIXES, atomic_write, output_dir, output_path
from pathweave.errors import InputError, OutputFileError, PathweaveError
from pathweave.fabric import Fabric
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


class OneLineErrors(TyperGroup):
    """The top-level command group: a malformed command line is one red line, exit 2.

    typer draws usage errors (``--repeat 0``, an unknown option) as a framed
    panel of several lines; here they read like every other pathweave error,
    ``error: pathweave bench planner: Invalid value for '--repeat': ...``.
    """

    def main(self, args: Any = None, prog_name: str | None = None,  # type: ignore[override]
             complete_var: str | None = None, standalone_mode: bool = True,
             **extra: Any) -> Any:
        try:
            rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except NoArgsIsHelpError as exc:
            console().print(exc.ctx.get_help())
            rv = exc.exit_code
        except ClickException as exc:
            ctx = getattr(exc, "ctx", None)
            where = f"{ctx.command_path}: " if ctx is not None else ""
            console(stderr=True).print(
                f"[bold red]error:[/] {escape(where + exc.format_message())}", soft_wrap=True
            )
            rv = exc.exit_code
        if not standalone_mode:
            return rv
        sys.exit(rv if isinstance(rv, int) else 0)


def _checked(check: Callable[[], Path]) -> Path:
    try:
        return check()
    except OutputFileError as exc:
        raise typer.BadParameter(str(exc)) from None


def out_file(value: Path | None) -> Path | None:
    """typer callback of ``--json``/``--csv`` options: refuse a bad path before any work."""
    return None if value is None else _checked(lambda: output_path(value))


def out_image(value: Path | None) -> Path | None:
    """typer callback of ``--png`` options: an image suffix (``.png`` added if none)."""
    if value is None:
        return None
    return _checked(lambda: output_path(value, suffixes=IMAGE_SUFFIXES, default_suffix=".png"))


def out_folder(value: Path | None) -> Path | None:
    """typer callback of ``--out DIR`` options: a writable folder, or one that can be made."""
    return None if value is None else _checked(lambda: output_dir(value))


def handles_user_errors(func: Callable[P, R]) -> Callable[P, R]:
    """Decorator form of :func:`user_errors` for command functions."""

    @functools.wraps(func)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        with user_errors():
            return func(*args, **kwargs)

    return wrapper


def load_fabric(spec: str) -> Fabric:
    """Resolve a ``PRESET|FILE`` argument and show what discovery assumed.

    Topology files (NCCL XML, ``nvidia-smi topo -m``) leave gaps that
    discovery fills with documented defaults; its notes and warnings (NICs
    left out, no NVLink in the file) go to stderr as ``note:`` lines, so
    stdout keeps only the tables.
    """
    from pathweave.fabric import resolve

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fab = resolve(spec)
    discovery = fab.meta.get("discovery") or {}
    notes = [str(w.message) for w in caught] + [str(n) for n in discovery.get("notes", ())]
    err = console(stderr=True)
    for note in dict.fromkeys(notes):
        err.print(f"[dim]note: {escape(note)}[/]", soft_wrap=True)
    return fab


def parse_bytes(text: str, option: str = "--bytes", minimum: int = 1) -> int:
    """A size option (``64M``, ``1GiB``) as whole bytes, at least ``minimum``.

    Raises :class:`~pathweave.errors.WorkloadError` naming the option and the
    value: not a size, past the int64 byte range, or below ``minimum``.
    """
    from pathweave.traffic import parse_size

    value = int(parse_size(text, what=option))
    if value < minimum:
        raise InputError(f"{option} {text.strip()} is below the minimum of {minimum} bytes")
    return value


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


def write_json(path: Path, data: Any) -> Path:
    """Write ``data`` as indented JSON through the one writer; the file written."""
    return atomic_write(path, (json.dumps(data, indent=2) + "\n").encode())
