"""The one writer of output files, and the checks every output path passes first.

Every file pathweave writes (``--json``, ``--png``, ``--out``, ``fabric.save``,
benchmark CSVs) goes through :func:`atomic_write`. It writes regular files
only: a device (``/dev/null``, ``/dev/full``), a directory, a pipe or a
socket is refused, because the write-then-rename that keeps readers from
seeing half a file would otherwise replace a device node with a plain file.
:func:`output_path` and :func:`output_dir` run the same checks without
writing, so a command can refuse a bad path before it starts any work.
The path :data:`STDOUT` (``-``) means standard output, as in most command
line tools: it passes every check and :func:`atomic_write` writes the bytes
there.
"""

from __future__ import annotations

import os
import stat
import sys
import tempfile
import uuid
from pathlib import Path

from pathweave.errors import OutputFileError

#: Suffixes matplotlib writes (the drawing's format follows the suffix).
IMAGE_SUFFIXES = (".png", ".svg", ".svgz", ".pdf", ".jpg", ".jpeg", ".eps", ".ps", ".tif",
                  ".tiff", ".webp")
#: The output path that means standard output.
STDOUT = "-"


def is_stdout(path: str | os.PathLike[str] | None) -> bool:
    """Whether ``path`` is :data:`STDOUT`.

    >>> is_stdout("-"), is_stdout("./-"), is_stdout(None)
    (True, False, False)
    """
    return path is not None and os.fspath(path) == STDOUT


def _nearest_existing(p: Path) -> Path:
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def _check_folder(folder: Path, shown: str) -> None:
    """``folder`` exists as a writable directory or can be created under one."""
    base = _nearest_existing(folder)
    if not base.is_dir():
        raise OutputFileError(f"{shown}: {base} is not a directory")
    if not os.access(base, os.W_OK | os.X_OK):
        raise OutputFileError(f"{shown}: folder {base} is not writable")
    # os.access says yes to root everywhere, /proc and read-only mounts included:
    # making (and removing) a folder there is the only sure test.
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".pathweave-probe-", dir=base))
    except OSError as exc:
        raise OutputFileError(f"{shown}: folder {base} is not writable "
                              f"({exc.strerror or exc})") from None


def _check_existing(p: Path) -> None:
    if not p.exists():
        return
    mode = p.stat().st_mode
    if stat.S_ISDIR(mode):
        raise OutputFileError(f"{p} is a directory; give a file name")
    if not stat.S_ISREG(mode):
        raise OutputFileError(
            f"{p} is not a regular file (a device, pipe or socket); pathweave writes "
            "regular files only"
        )


def output_path(
    path: str | os.PathLike[str],
    *,
    suffixes: tuple[str, ...] | None = None,
    default_suffix: str | None = None,
) -> Path:
    """Check that ``path`` can be written as a regular file; the path that will be written.

    Parameters
    ----------
    path
        The requested file.
    suffixes
        Allowed suffixes (lower case, with the dot); ``None`` allows any.
    default_suffix
        Appended when ``path`` has no suffix (``plot`` -> ``plot.png``).

    Returns
    -------
    pathlib.Path
        ``path``, with ``default_suffix`` appended where it had none.

    Raises
    ------
    OutputFileError
        ``path`` is empty, a directory, a device or another special file, its
        folder is not writable, or its suffix is not allowed.

    Examples
    --------
    >>> output_path("results/plot", default_suffix=".png").name
    'plot.png'
    >>> try:
    ...     output_path("/dev/null")
    ... except ValueError as exc:
    ...     print(str(exc)[:38])
    /dev/null is not a regular file (a dev
    """
    text = os.fspath(path)
    if not str(text).strip():
        raise OutputFileError("output path is empty")
    if is_stdout(text):
        return Path(STDOUT)  # standard output; the format comes from the option
    p = Path(text)
    _check_existing(p)  # as given: `--png /dev/null` must not become /dev/null.png
    if default_suffix and not p.suffix:
        p = p.with_name(p.name + default_suffix)
        _check_existing(p)
    if suffixes is not None and p.suffix.lower() not in suffixes:
        raise OutputFileError(
            f"{p}: unknown suffix {p.suffix or '(none)'!r}; use one of {', '.join(suffixes)}"
        )
    _check_folder(p.parent, str(p))
    return p


def output_dir(path: str | os.PathLike[str]) -> Path:
    """Check that ``path`` is, or can be made, a writable directory; return it.

    Raises
    ------
    OutputFileError
        ``path`` exists and is not a directory, or no writable folder holds it.
    """
    text = os.fspath(path)
    if not str(text).strip():
        raise OutputFileError("output folder is empty")
    p = Path(text)
    if p.exists() and not p.is_dir():
        raise OutputFileError(f"{p} exists and is not a directory")
    _check_folder(p, str(p))
    return p


def atomic_write(path: str | os.PathLike[str], payload: bytes) -> Path:
    """Write ``payload`` to the regular file ``path`` so that readers never see half a file.

    ``-`` (:data:`STDOUT`) writes the bytes to standard output instead.

    The folder is created if needed; the bytes go to a unique sibling first,
    are flushed to disk and renamed over ``path`` (``os.replace`` is atomic on
    one file system). A symbolic link is written through, not replaced.

    Returns
    -------
    pathlib.Path
        The file written.

    Raises
    ------
    OutputFileError
        ``path`` is not a place for a regular file (see :func:`output_path`).
    OSError
        The write failed (disk full, permission, ...); no file is left behind.
    """
    if is_stdout(path):
        stream = getattr(sys.stdout, "buffer", None)
        if stream is None:  # a text-only stream (some test harnesses)
            sys.stdout.write(payload.decode("utf-8", errors="replace"))
        else:
            sys.stdout.flush()  # keep whatever was printed before in order
            stream.write(payload)
            stream.flush()
        return Path(STDOUT)
    p = output_path(path)
    if p.is_symlink():
        p = p.resolve()
    p.parent.mkdir(parents=True, exist_ok=True)
    # A unique sibling opened with "x" (O_EXCL) rather than mkstemp, so the
    # final file gets the usual umask-derived permissions, not mkstemp's 0600.
    tmp = p.with_name(f".{p.name}.{os.getpid()}.{uuid.uuid4().hex}.tmp")
    try:
        with tmp.open("xb") as handle:
            handle.write(payload)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, p)
    except BaseException:
        # Leave no temp file behind, whatever went wrong (including Ctrl-C).
        tmp.unlink(missing_ok=True)
        raise
    return p


#: Largest input file pathweave reads (fabric, topology and trace files are
#: kilobytes to a few megabytes; this refuses /dev/zero-like endless input).
MAX_INPUT_BYTES = 256 << 20


def read_input(path: str | os.PathLike[str], what: str = "file",
               max_bytes: int = MAX_INPUT_BYTES) -> bytes:
    """The bytes of the regular file ``path``, at most ``max_bytes`` of them.

    Raises
    ------
    InputError
        ``path`` is a directory, a device, a pipe or a socket, or too large.
    OSError
        It cannot be read.
    """
    from pathweave.errors import InputError

    p = Path(path)
    mode = p.stat().st_mode
    if stat.S_ISDIR(mode):
        raise InputError(f"{what} {p} is a directory, not a regular file")
    if not stat.S_ISREG(mode):
        raise InputError(f"{what} {p} is not a regular file (a device, pipe or socket)")
    with p.open("rb") as handle:
        data = handle.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise InputError(f"{what} {p} is larger than the {max_bytes >> 20} MiB limit")
    return data


def excerpt(value: object, limit: int = 60) -> str:
    """``repr(value)`` cut to about ``limit`` characters, for error messages about file content.

    >>> excerpt("x" * 100)
    "'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx... (100 characters)"
    """
    text = repr(value)
    if len(text) <= limit:
        return text
    size = f"{len(value)} characters" if isinstance(value, (str, bytes)) else f"{len(text)} chars"
    return f"{text[: limit - 4]}... ({size})"
