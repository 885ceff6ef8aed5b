"""Helpers every command shares: consoles, error reporting, output paths, number formatting."""

from __future__ import annotations

import functools
import importlib.util
import json
import math
import os
import sys
import time
import warnings
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, NoReturn, ParamSpec, TextIO, TypeVar

import typer
from numba.core import event as numba_event
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text
from typer._click.exceptions import ClickException, NoArgsIsHelpError
from typer.core import TyperGroup

from pathweave._files import IMAGE_SUFFIXES, atomic_write, is_stdout, output_dir, output_path
from pathweave._registry import Registry
from pathweave.errors import InputError, OutputFileError, PathweaveError
from pathweave.fabric import Fabric
from pathweave.plan import policies, policy_info

#: Exit code for bad input (an unknown policy, a malformed workload, ...);
#: typer uses the same code for malformed command lines.
EXIT_BAD_INPUT = 2
#: Exit code of a benchmark whose outputs (or gradients) differ from torch's (a correctness
#: failure); a missed speed target keeps exit code 0 (its ``MISS`` line says so).
EXIT_MISMATCH = 1

P = ParamSpec("P")
R = TypeVar("R")

#: The ``pathweave bench`` commands, in ``bench --help``'s order: each is a
#: typer command function in a module here (``planner`` and ``sim`` share
#: bench.py), registered with ``@BENCHES.register(name)``; the CLI adds every
#: one (cli/main.py).
BENCHES: Registry[Callable[..., None]] = Registry(
    "benchmark", error=InputError,
    modules=tuple(f"pathweave.cli.{m}" for m in (
        "bench", "paper", "dataplane", "emulate", "moe", "hostcost")),
)

#: How a benchmark's :class:`~pathweave.bench._report.Check` line starts, by ``passed``.
CHECK_MARKS = {True: "[green]PASS[/]", False: "[red]MISS[/]", None: "[dim]  - [/]"}


def print_checks(out: Console, checks: Sequence[Any]) -> None:
    """Print every benchmark's target lines the one way: ``PASS``/``MISS``/``-`` and the text."""
    for check in checks:
        out.print(f"{CHECK_MARKS[check.passed]} {check.text}", soft_wrap=True)


def add_columns(
    table: Table, names: Iterable[str], *, left: Collection[str] = (), no_wrap: bool = False
) -> Table:
    """Add a column per name to ``table``, the one way every CLI table lays out its columns:
    numbers right-aligned, the ``left`` columns (labels: a policy, a workload) left-aligned.

    Examples
    --------
    >>> t = add_columns(Table(), ("policy", "time", "bytes"), left={"policy", "bytes"})
    >>> [(c.header, c.justify) for c in t.columns]
    [('policy', 'left'), ('time', 'right'), ('bytes', 'left')]
    """
    for name in names:
        table.add_column(name, justify="left" if name in left else "right", no_wrap=no_wrap)
    return table


def console(*, stderr: bool = False) -> Console:
    """A rich console bound to the current stdout or stderr.

    Built per call rather than once at import so that test runners which
    swap ``sys.stdout`` see the output. Off a terminal (a pipe, a CI log)
    rich would fall back to 80 columns and cut the columns of wider tables
    short; there the width is :data:`PIPE_WIDTH`, so tables keep their natural
    width and every column, unless ``COLUMNS`` asks for a width, as rich and
    :func:`shutil.get_terminal_size` read it (``scripts/docs.sh`` sets it, so
    the transcripts in the docs are those of a terminal that wide).
    """
    stream = sys.stderr if stderr else sys.stdout
    width = None if stream.isatty() else _pipe_width()
    return Console(file=stream, width=width, highlight=False)


def _pipe_width() -> int:
    """``COLUMNS`` where it is a positive whole number, else :data:`PIPE_WIDTH`."""
    columns = os.environ.get("COLUMNS", "")
    return int(columns) if columns.isdigit() and int(columns) > 0 else PIPE_WIDTH


#: Console width off a terminal: wider than any table pathweave prints.
PIPE_WIDTH = 10_000
#: Rule width off a terminal (rich would draw :data:`PIPE_WIDTH` characters).
PIPE_RULE_WIDTH = 100


def human_console(*outputs: Path | None) -> Console:
    """The console for tables and notes: stderr when an output option is ``-`` (stdout)."""
    return console(stderr=any(is_stdout(o) for o in outputs))


def rule(out: Console, title: str = "") -> None:
    """A horizontal rule with ``title``, no wider than :data:`PIPE_RULE_WIDTH` off a terminal."""
    if out.width <= PIPE_RULE_WIDTH or out.is_terminal:
        out.rule(title, align="left")
        return
    head = f"── {title} " if title else ""
    out.print(head + "─" * max(3, PIPE_RULE_WIDTH - len(Text.from_markup(head))))


def wrote(out: Console, path: Path) -> None:
    """``wrote PATH`` after an output file; nothing for standard output."""
    if not is_stdout(path):
        out.print(f"wrote {path}")


class _CompileNotice(numba_event.Listener):
    """Writes one line to ``stream`` when the first of pathweave's kernels compiles (a
    real compile: a kernel loaded from numba's cache sends no ``numba:compile`` event)."""

    def __init__(self, stream: TextIO | None) -> None:
        self.stream, self.told = stream, False

    def on_start(self, event: numba_event.Event) -> None:
        func = getattr((event.data or {}).get("dispatcher"), "py_func", None)
        if not self.told and getattr(func, "__module__", "").startswith("pathweave."):
            self.told = True
            # sys.stderr as it is now: a progress bar on screen redirects it above itself
            out = self.stream or sys.stderr
            out.write(COMPILE_NOTICE + "\n")
            out.flush()

    def on_end(self, event: numba_event.Event) -> None:
        pass


#: What :func:`announce_compiles` writes.
COMPILE_NOTICE = ("pathweave: compiling its kernels for this machine, once (up to a minute "
                  "on a few cores); later runs load them from numba's cache")


@functools.cache
def announce_compiles(stream: TextIO | None = None) -> None:
    """Say once, on ``stream``, that this process compiles pathweave's numba kernels.

    A fresh installation's first command compiles every kernel it runs (up to a
    minute on 2 cores), which would otherwise look like a hang. Default: stderr,
    only where it is a terminal (a pipe, a CI log or a test runner gets nothing).
    Installed once per process and stream.
    """
    if stream is None and not sys.stderr.isatty():
        return
    numba_event.register("numba:compile", _CompileNotice(stream))


#: Work that runs longer than this reports its steps on stderr when stderr is no terminal.
PROGRESS_AFTER_S = 1.0


class Steps:
    """Progress of a command's steps on stderr, so stdout keeps only the results.

    On a terminal a transient rich progress bar; elsewhere (a pipe, a CI log)
    one ``label: step (i/n)`` line per step once the work has run longer than
    :data:`PROGRESS_AFTER_S`, so quick commands stay quiet.
    """

    def __init__(self, label: str, total: int | None = None) -> None:
        self.label, self.total, self.done = label, total, 0
        self._start = time.monotonic()
        err = console(stderr=True)
        self._bar: Progress | None = None
        if err.is_terminal:
            self._bar = Progress(TextColumn("{task.description}"), BarColumn(),
                                 MofNCompleteColumn(), TimeElapsedColumn(), console=err,
                                 transient=True)
            self._task = self._bar.add_task(label, total=total)
        self._err = err

    def __enter__(self) -> Steps:
        if self._bar is not None:
            self._bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()

    def update(self, text: str, done: int | None = None, total: int | None = None) -> None:
        """Step ``text`` begins; ``done`` steps of ``total`` are finished (default: one more)."""
        self.done = self.done + 1 if done is None else done
        self.total = total if total is not None else self.total
        what = f"{self.label}: {text}"
        if self._bar is not None:
            self._bar.update(self._task, completed=self.done, total=self.total,
                             description=what)
        elif time.monotonic() - self._start >= PROGRESS_AFTER_S:
            count = f" ({self.done}/{self.total})" if self.total else ""
            self._err.print(f"[dim]{escape(what)}{count}[/]", soft_wrap=True)


def fail(message: str, code: int = EXIT_BAD_INPUT) -> NoReturn:
    """Print ``error: message`` in red on stderr (one line) and exit with ``code``."""
    console(stderr=True).print(f"[bold red]error:[/] {escape(message)}", soft_wrap=True)
    raise typer.Exit(code)


def require_torch(what: str) -> None:
    """Fail (one line, :data:`EXIT_BAD_INPUT`) unless torch is installed; ``what`` needs it."""
    if importlib.util.find_spec("torch") is None:
        fail(f"{what} needs torch, a dependency of pathweave: pip install torch")


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
            # Making the error made the help: typer's rich help printed itself then
            # (the message is empty); plain help is the message, printed here.
            if exc.format_message().strip():
                console().print(exc.format_message())
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


def json_option(help: str = "Write the records as JSON (- for stdout).") -> Any:
    """The ``--json FILE`` option of a command that writes records (``-``: stdout)."""
    return typer.Option("--json", metavar="FILE", callback=out_file, help=help)


def out_dir_option(help: str) -> Any:
    """The ``--out DIR`` option of a command that writes files into a folder."""
    return typer.Option("--out", metavar="DIR", callback=out_folder, help=help)


def time_limit_option(help: str) -> Any:
    """The ``--time-limit SECONDS`` option of the LP optimum (HiGHS)."""
    return typer.Option("--time-limit", min=0.001, metavar="SECONDS", help=help)


def quick_option(help: str) -> Any:
    """The ``--quick`` flag of a command with a smaller run; ``help`` says what it keeps."""
    return typer.Option("--quick", help=help)


def repeat_option(help: str) -> Any:
    """The ``--repeat N`` option of a benchmark whose default repeats depend on the case."""
    return typer.Option("--repeat", min=1, metavar="N", help=help, show_default=False)


def workload_option(help: str) -> Any:
    """The ``--workload SPEC`` option (:func:`pathweave.traffic.parse_workload`); a command
    that also takes it as an argument reads both through :func:`fabric_and_workload`."""
    return typer.Option("--workload", "-w", metavar="SPEC", help=help, show_default=False)


def policy_option(help: str) -> Any:
    """The ``--policy P[,P...]`` option: policy names, comma-separated, or ``all``."""
    return typer.Option("--policy", "-p", metavar="P[,P...]", help=help)


def groups_option(what: str) -> Any:
    """The ``--groups COUNTxSIZE`` option (:mod:`pathweave.cli._groups`); ``what`` ends its help."""
    lead = "Concurrent groups, each running the workload on its own ranks "
    return typer.Option("--groups", "-g", metavar="COUNTxSIZE[:layout=...,stagger=S]",
                        help=lead + what, show_default=False)


# Options several commands share, declared once (typer reads them from the
# annotations: ``json_out: JsonOut = None``).
JsonOut = Annotated[Path | None, json_option()]
FabricSpec = Annotated[str | None, typer.Option("--fabric", "-f", metavar="PRESET|FILE",
                                                help="Preset spec or file.", show_default=False)]
#: ``pathweave plan dgx-h100 hotspot:0.8``: the fabric and the workload as arguments,
#: the form ``topo show PRESET`` taught (:func:`fabric_and_workload` resolves them).
FabricWorkloadArgs = Annotated[list[str] | None, typer.Argument(
    metavar="[FABRIC [WORKLOAD]]", show_default=False,
    help="The fabric and the workload, as --fabric and --workload give them.")]


def fabric_and_workload(command: str, fabric: str | None, workload: str | None,
                        args: list[str] | None) -> tuple[str, str]:
    """``(fabric, workload)`` from ``--fabric``/``--workload`` and the arguments, which
    fill in order what the options leave out.

    Anything missing or left over is one :func:`fail` line that names it
    and shows how ``pathweave COMMAND`` takes both.
    """
    got = {"fabric": fabric, "workload": workload}
    free = [name for name, value in got.items() if value is None]
    args = list(args or [])
    if len(args) > len(free):
        given = " and ".join(f"--{n}" for n in got if n not in free)
        fail(f"pathweave {command}: unexpected argument {' '.join(args[len(free):])} ("
             + (f"{given} given, " if given else "") + "expected at most FABRIC WORKLOAD)")
    got.update(zip(free, args, strict=False))
    missing = [name for name, value in got.items() if value is None]
    if missing:
        fail(f"pathweave {command}: missing the {' and the '.join(missing)}: e.g. pathweave "
             f"{command} dgx-h100:nodes=2 hotspot:0.8, or --fabric dgx-h100:nodes=2 "
             "--workload hotspot:0.8")
    return got["fabric"], got["workload"]
BytesPerRank = Annotated[str, typer.Option("--bytes", "-b", metavar="SIZE",
                                           help="Payload per rank (64M, 1GiB, 100MB, ...).")]


def handles_user_errors(func: Callable[P, R]) -> Callable[P, R]:
    """Decorator form of :func:`user_errors` for command functions."""

    @functools.wraps(func)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        with user_errors():
            return func(*args, **kwargs)

    return wrapper


def load_fabric(spec: str, *, dense_paths: bool = True) -> Fabric:
    """Resolve a ``PRESET|FILE`` argument and show what discovery assumed.

    ``dense_paths``: as :func:`pathweave.fabric.resolve`'s (False where only
    concurrent groups' own paths are compiled).

    Topology files (NCCL XML, ``nvidia-smi topo -m``) leave gaps that
    discovery fills with documented defaults; its notes and warnings (NICs
    left out, no NVLink in the file) go to stderr as ``note:`` lines, so
    stdout keeps only the tables.
    """
    from pathweave.fabric import resolve

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fab = resolve(spec, dense_paths=dense_paths)
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


def fmt_time(seconds: float | None, digits: int = 3) -> str:
    """A time in the unit that suits it, with ``digits`` decimals: ``21.315 ms``, ``426.7 ns``.

    Each value picks its own unit (s, ms, us, ns), so a latency-bound size
    does not print as ``0.000 ms``.

    >>> fmt_time(0.021315), fmt_time(4.2e-7), fmt_time(2.5), fmt_time(None)
    ('21.315 ms', '420.000 ns', '2.500 s', 'n/a')
    """
    if seconds is None or not math.isfinite(seconds):
        return "n/a"
    for scale, unit in ((1.0, "s"), (1e-3, "ms"), (1e-6, "us")):
        if abs(seconds) >= scale:
            return f"{seconds / scale:.{digits}f} {unit}"
    return f"{seconds / 1e-9:.{digits}f} ns"


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


def workload_header(fab: Fabric, workload: str, demand: Any) -> str:
    """``fabric (N GPUs), workload W, X per rank, Y in all``, the sizes from ``demand`` itself.

    A workload such as ``moe:...`` or a demand file sizes itself, so the
    ``--bytes`` option does not say how much moves; the matrix does. Unequal
    rows give the mean and the largest.
    """
    rows = [float(x) for x in demand.sum(axis=1)]
    total = sum(rows)
    mean = total / max(1, len(rows))
    per_rank = f"{fmt_bytes(mean)} per rank"
    if rows and max(rows) > mean * 1.001:
        per_rank = f"{fmt_bytes(mean)} per rank on average (at most {fmt_bytes(max(rows))})"
    return (f"[bold]{escape(fab.name)}[/] ({fab.num_ranks} GPUs), workload "
            f"[bold]{escape(workload)}[/], {per_rank}, {fmt_bytes(total)} in all")


def write_json(path: Path, data: Any) -> Path:
    """Write ``data`` as indented JSON through the one writer (``-``: stdout); the file written."""
    return atomic_write(path, (json.dumps(data, indent=2) + "\n").encode())
