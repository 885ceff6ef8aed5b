"""Print, one per line, the uv arguments for the package sources pip is configured with.

Reads ``pip config list`` on stdin (``PIP_*`` variables show there as
``:env:.`` entries, listed first). uv reads no pip configuration; given
these, it looks where pip looks: a mirror set as ``index-url`` (the first
one listed: the variable's, which pip also prefers), and every local wheel
folder (``find-links``) and extra index any section names (uv needs none of
them to exist).
"""

from __future__ import annotations

import shlex
import sys

FLAGS = {"index-url": "--index-url", "extra-index-url": "--extra-index-url",
         "find-links": "--find-links"}


def main() -> int:
    seen: list[tuple[str, str]] = []
    for line in sys.stdin:
        key, _, value = line.strip().partition("=")
        flag = FLAGS.get(key.rpartition(".")[2])
        if flag is None or not value:
            continue
        for source in " ".join(shlex.split(value)).split():
            if (flag, source) in seen or (flag == "--index-url" and
                                          any(f == flag for f, _ in seen)):
                continue
            seen.append((flag, source))
    for flag, source in seen:
        print(flag)
        print(source)
    return 0


if __name__ == "__main__":
    sys.exit(main())
