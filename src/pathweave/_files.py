"""File helpers shared by every layer that writes output."""

from __future__ import annotations

import os
import uuid
from pathlib import Path


def atomic_write(path: Path, payload: bytes) -> None:
    """Write ``payload`` to ``path`` so that readers never see half a file.

    The bytes go to a unique sibling first and are renamed over ``path``
    (``os.replace`` is atomic on one file system).
    """
    # A unique sibling opened with "x" (O_EXCL) rather than mkstemp, so the
    # final file gets the usual umask-derived permissions, not mkstemp's 0600.
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex}.tmp")
    try:
        with tmp.open("xb") as handle:
            handle.write(payload)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        # Leave no temp file behind, whatever went wrong (including Ctrl-C).
        tmp.unlink(missing_ok=True)
        raise
