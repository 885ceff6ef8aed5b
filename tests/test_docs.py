"""The transcripts and examples in README.md and docs/cli.md against the live code.

Every command transcript sits in a ``docs.sh`` block (``pathweave._docgen``);
the quick ones are rerun here and must print what the file shows, wall-clock
columns aside, and the README's Python session runs as a doctest. When one
fails, ``bash scripts/docs.sh`` rewrites the blocks (and the doctest's
failure shows the new numbers).
"""

from __future__ import annotations

import doctest
import os
import re
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pathweave import _docgen
from pathweave._docgen import DocsError
from pathweave.cli.main import app

ROOT = Path(__file__).resolve().parents[1]
_FENCE = re.compile(r"^```(?P<lang>\S*)\n(?P<body>.*?)^```$", re.M | re.S)


def blocks(name: str) -> list[_docgen.Block]:
    return _docgen.parse((ROOT / name).read_text(), name)


QUICK = [(name, b) for name in _docgen.DOC_FILES for b in blocks(name) if not b.slow]


def marked_spans(text: str) -> list[tuple[int, int]]:
    """Character spans of the docs.sh blocks of ``text``."""
    starts = [m.start() for m in re.finditer(r"^<!-- docs\.sh", text, re.M)]
    ends = [m.end() for m in re.finditer(r"^<!-- /docs\.sh -->", text, re.M)]
    return list(zip(starts, ends, strict=True))


@pytest.mark.parametrize("name", _docgen.DOC_FILES)
def test_every_transcript_is_in_a_block_of_its_own_command(name: str):
    text = (ROOT / name).read_text()
    spans = marked_spans(text)
    transcripts = [m for m in _FENCE.finditer(text) if m["body"].startswith("$ ")]
    assert transcripts or name != "README.md"
    for m in transcripts:
        inside = [s for s in spans if s[0] < m.start() and m.end() < s[1]]
        line = text.count("\n", 0, m.start()) + 1
        assert inside, f"{name}:{line}: transcript without a docs.sh marker"
    for b in blocks(name):
        assert b.body.lstrip().startswith(f"```\n$ {b.command}\n"), (name, b.first + 1)


@pytest.mark.parametrize(("name", "block"), QUICK,
                         ids=[f"{n}:{b.first + 1}:{b.command}" for n, b in QUICK])
def test_quick_transcript_matches_the_live_output(name: str, block: _docgen.Block):
    # In-process (one import of the CLI for all of them) at the width docs.sh
    # runs them at; anything else must be tagged slow.
    assert block.argv[0] == "pathweave" and not block.env, \
        f"{name}:{block.first + 1}: only pathweave commands run here; tag the block slow"
    result = CliRunner().invoke(app, block.argv[1:], env={"COLUMNS": str(block.columns)})
    assert result.exit_code == 0, result.output
    live = _docgen.clean(result.stdout, block.only)
    shown = _docgen.fenced_output(block.body)
    assert _docgen.comparable(shown) == _docgen.comparable(live), (
        f"{name}:{block.first + 1} is stale; `bash scripts/docs.sh` rewrites it. Live:\n{live}")


def test_slow_blocks_say_when_and_where_they_ran():
    slow = [(n, b) for n in _docgen.DOC_FILES for b in blocks(n) if b.slow]
    assert slow
    for name, b in slow:
        last = b.body.rstrip().splitlines()[-1]
        assert re.fullmatch(r"<sub>Measured \d{4}-\d\d-\d\d on \d+ CPU cores .*, load "
                            r"average [\d.]+, .*</sub>", last), \
            f"{name}:{b.first + 1}: {last!r}"


def test_readme_python_session_runs():
    text = (ROOT / "README.md").read_text()
    sessions = [m for m in _FENCE.finditer(text) if m["lang"] == "pycon"]
    assert sessions
    parser = doctest.DocTestParser()
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    for m in sessions:
        line = text.count("\n", 0, m.start()) + 1
        test = parser.get_doctest(m["body"], {}, f"README.md:{line}", "README.md", line)
        runner.run(test)
    assert runner.summarize(verbose=False).failed == 0


# --- the machinery, on files written here ---------------------------------------------

PRINT = f"{Path(sys.executable).name} -c 'print(\"x = 42   \")'"


def doc(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "doc.md"
    path.write_text(text)
    return path


def block_text(command: str, output: str, tags: str = "") -> str:
    return (f"<!-- docs.sh{tags}: {command} -->\n```\n$ {command}\n{output}\n```\n"
            "<!-- /docs.sh -->\n")


def test_update_rewrites_a_stale_block_and_nothing_else(tmp_path: Path):
    before, after = "intro\n\n", "\nlater text\n"
    path = doc(tmp_path, before + block_text(PRINT, "x = 41") + after)
    assert _docgen.update(path, tmp_path, check=True)[0].endswith("UPDATED")
    assert "x = 41" in path.read_text()  # --check writes nothing
    report = _docgen.update(path, tmp_path)
    assert report == [f"doc.md:3 {PRINT}: UPDATED"]
    # The command's own output, trailing blanks trimmed; the rest of the file as it was.
    assert path.read_text() == before + block_text(PRINT, "x = 42") + after
    inode = path.stat().st_ino
    assert _docgen.update(path, tmp_path) == [f"doc.md:3 {PRINT}: unchanged"]
    assert path.stat().st_ino == inode  # not rewritten


def test_slow_blocks_run_only_when_asked_and_are_stamped(tmp_path: Path):
    path = doc(tmp_path, block_text(PRINT, "old", " slow"))
    assert _docgen.update(path, tmp_path)[0].endswith("skipped (slow; --slow reruns it)")
    assert "old" in path.read_text()
    _docgen.update(path, tmp_path, slow=True)
    (b,) = _docgen.parse(path.read_text())
    assert _docgen.fenced_output(b.body) == "x = 42"
    assert f"{os.cpu_count()} CPU cores" in b.body.splitlines()[-1]


def test_tags_only_columns_and_env_words(tmp_path: Path):
    command = (f"PW_DOCS_TEST=hello {Path(sys.executable).name} -c 'import os; print(1); "
               "print(\"PASS\", os.environ[\"PW_DOCS_TEST\"], os.environ[\"COLUMNS\"]); print(2)'")
    path = doc(tmp_path, block_text(command, "", " only=^PASS columns=42") + block_text(PRINT, ""))
    assert len(_docgen.update(path, tmp_path, match="PW_DOCS")) == 1  # --match: the first only
    first, second = _docgen.parse(path.read_text())
    assert _docgen.fenced_output(first.body) == "PASS hello 42"
    assert _docgen.fenced_output(second.body) == ""


def test_a_failing_command_leaves_the_file_alone(tmp_path: Path):
    command = f"{Path(sys.executable).name} -c 'import sys; sys.exit(3)'"
    path = doc(tmp_path, block_text(command, "kept"))
    with pytest.raises(DocsError, match="exit code 3"):
        _docgen.update(path, tmp_path)
    assert "kept" in path.read_text()


@pytest.mark.parametrize(("text", "message"), [
    ("<!-- docs.sh: a -->\n", "doc.md:1: docs.sh marker never closed"),
    ("<!-- docs.sh: a -->\n<!-- docs.sh: b -->\n", "2: docs.sh marker inside the block of line 1"),
    ("<!-- /docs.sh -->\n", "1: <!-- /docs.sh --> without a marker"),
    ("<!-- docs.sh fast: a -->\n<!-- /docs.sh -->\n", "unknown docs.sh tag 'fast'"),
    ("x\n<!-- docs.sh a -->\n", "2: malformed docs.sh marker"),
    ("<!-- docs.sh: X=1 -->\n<!-- /docs.sh -->\n", "names no command"),
])
def test_bad_markers_name_the_line(text: str, message: str):
    with pytest.raises(DocsError, match=message):
        _docgen.parse(text, "doc.md")


def test_comparable_ignores_wall_clock_columns_only():
    # A rich table as `pathweave plan` prints it; timings in "planned in" differ.
    def table(congestion: str, planned: str) -> str:
        return ("┏━━━━━━━━┳━━━━━━━━━━━━┳━━━━━━━━━━━━┓\n"
                "┃ policy ┃ congestion ┃ planned in ┃\n"
                "┡━━━━━━━━╇━━━━━━━━━━━━╇━━━━━━━━━━━━┩\n"
                f"│ static │ {congestion:>10} │ {planned:>10} │\n"
                "└────────┴────────────┴────────────┘\n"
                "planned in 3 ms\n")
    assert _docgen.comparable(table("5.100 ms", "292 us")) == \
        _docgen.comparable(table("5.100 ms", "4.36 ms"))
    assert _docgen.comparable(table("5.100 ms", "292 us")) != \
        _docgen.comparable(table("5.101 ms", "292 us"))
    # Text outside a table is compared as it is.
    assert _docgen.comparable("planned in 3 ms") != _docgen.comparable("planned in 4 ms")
