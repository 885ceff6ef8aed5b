"""The package's import structure (docs/architecture.md, "Layers").

Every module under ``src/pathweave`` is parsed (``ast``; nothing is imported)
and its imports of pathweave are checked against three rules:

- **Layers.** Imports point down or sideways within a layer, never up. The
  order (bottom first) is ``LAYERS``; a module belongs to its top-level
  subpackage (``pathweave.plan.mintime`` to ``plan``) or, outside one, to its
  own name (``pathweave.distributed`` to ``distributed``). Every import counts
  here, lazy ones inside functions and ``TYPE_CHECKING`` ones included: a lazy
  import is still a dependency, only a later one.
- **Private names stay home.** A module of one unit does not import a private
  module (a path component starting with ``_``) or a private name of another
  unit, nor read ``module._name`` of a module of another unit it imported. The
  bottom modules ``_check``, ``_files``, ``_spec``, ``_log``, ``_cache``, ``_registry`` and
  ``_sort`` are private to the distribution, not to a unit: every unit of ``pathweave``
  shares them.
- **No circles.** The graph of module-level imports (run when the module is
  imported) has no cycle. Imports inside functions are left out: they run
  after every module has loaded, which is how the torch layers (``runtime``,
  ``distributed``, ``moe``, ``emulate``'s rank body) load lazily, and they
  cannot make a partially initialised module visible. ``TYPE_CHECKING``
  imports never run and are left out too.

An attribute read on an object (``orch._groups``) is not an import and is not
seen here; such reads were replaced by public attributes by hand.

The same layers, the private modules and the absence of circles between units
are also import-linter contracts (``[tool.importlinter]`` in pyproject.toml),
which ``lint-imports`` checks on the import graph: those tests are at the end.
"""

from __future__ import annotations

import ast
import functools
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "pathweave"

#: Bottom first; units in one entry form one layer (they may import each
#: other). ``pathweave`` is the package's own ``__init__`` (the facade that
#: re-exports every layer).
LAYERS: tuple[frozenset[str], ...] = tuple(
    frozenset(names.split())
    for names in (
        "errors _check _files _spec _log _cache _registry _sort",
        "fabric",
        "traffic",
        "plan",
        "sim",
        "runtime distributed nn",
        "moe",
        "emulate",
        "bench perf calibrate viz",
        "cli _docgen",
        "pathweave",
    )
)
LEVEL = {unit: i for i, layer in enumerate(LAYERS) for unit in layer}
#: The torch layers, loaded on first use (imports of them inside functions).
TORCH = frozenset({"runtime", "distributed", "nn", "moe", "emulate"})
#: Private to the distribution, shared by every unit.
SHARED = frozenset({"_check", "_files", "_spec", "_log", "_cache", "_registry", "_sort"})


@dataclass(frozen=True)
class Import:
    """One import of a pathweave module (``name``: an imported name, or "")."""

    source: str
    target: str
    name: str
    line: int
    lazy: bool  # inside a function or under TYPE_CHECKING


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def unit(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def _is_type_checking(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
        or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")
    )


def _resolve(module: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".")
    if MODULES[module].name != "__init__.py":
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _walk(module: str, node: ast.AST, lazy: bool) -> Iterator[tuple[Import, str]]:
    """Yield (import, local name bound) for each pathweave import under ``node``."""
    for child in ast.iter_child_nodes(node):
        inner = lazy or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef)
        inner = inner or _is_type_checking(child)
        if isinstance(child, ast.Import):
            for alias in child.names:
                if alias.name.split(".")[0] == "pathweave":
                    bound = alias.asname or alias.name
                    yield Import(module, alias.name, "", child.lineno, inner), bound
        elif isinstance(child, ast.ImportFrom):
            target = _resolve(module, child)
            if target.split(".")[0] == "pathweave":
                for alias in child.names:
                    sub = f"{target}.{alias.name}"
                    bound = alias.asname or alias.name
                    if sub in MODULES:
                        yield Import(module, sub, "", child.lineno, inner), bound
                    else:
                        yield Import(module, target, alias.name, child.lineno, inner), ""
        yield from _walk(module, child, inner)


def _parse(module: str) -> ast.Module:
    return _parse_file(MODULES[module])


@functools.cache
def _parse_file(path: Path) -> ast.Module:
    # Once per file for the whole run: every check (and each rule's test on a
    # hand-written module) walks all ~150 modules again; the trees are only read.
    return ast.parse(path.read_text(), str(path))


def imports() -> list[Import]:
    return [imp for module in MODULES for imp, _ in _walk(module, _parse(module), False)]


def _private(module: str) -> bool:
    return any(p.startswith("_") and not p.startswith("__") for p in module.split(".")[1:])


def layer_violations() -> list[str]:
    out = []
    for imp in imports():
        src, dst = unit(imp.source), unit(imp.target)
        if imp.target != "pathweave" and LEVEL[dst] > LEVEL[src]:
            out.append(f"{imp.source}:{imp.line} imports {imp.target} ({src} below {dst})")
    return out


def private_violations() -> list[str]:
    out = []
    for module in MODULES:
        tree = _parse(module)
        cross_modules = {}  # local name -> module of another unit
        for imp, bound in _walk(module, tree, False):
            if unit(imp.target) == unit(module) or unit(imp.target) in SHARED:
                continue
            where = f"{module}:{imp.line} imports {imp.target}"
            if _private(imp.target):
                out.append(where)
            elif imp.name.startswith("_"):
                out.append(f"{where}.{imp.name}")
            if bound:
                cross_modules[bound] = imp.target
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
                and isinstance(node.value, ast.Name)
                and node.value.id in cross_modules
            ):
                name = f"{cross_modules[node.value.id]}.{node.attr}"
                out.append(f"{module}:{node.lineno} reads {name}")
    return sorted(set(out))  # one line per statement, not per imported name


def circles() -> list[list[str]]:
    """Every cycle's modules (one list per strongly connected component > 1)."""
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for imp in imports():
        deferred = imp.lazy and unit(imp.target) in TORCH and unit(imp.target) != unit(imp.source)
        if not deferred and imp.target in MODULES and imp.target != imp.source:
            graph[imp.source].add(imp.target)
    # Tarjan's strongly connected components, iteratively.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        top = stack.pop()
                        on_stack.discard(top)
                        component.append(top)
                        if top == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph[child]))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return found


def test_every_unit_has_a_layer():
    assert {unit(m) for m in MODULES} <= set(LEVEL)


def test_no_upward_import():
    assert layer_violations() == []


def test_no_private_name_across_units():
    assert private_violations() == []


def test_no_import_circle():
    assert circles() == []


# The checks themselves, on hand-written modules: each rule must fire.
@pytest.mark.parametrize(
    ("module", "source", "rule"),
    [
        ("pathweave.plan.mintime", "from pathweave.sim import SimModel\n", layer_violations),
        ("pathweave.fabric.io", "def f():\n    import pathweave.cli.main\n", layer_violations),
        ("pathweave.moe.layer", "from pathweave.runtime._validate import x\n", private_violations),
        ("pathweave.bench.moe", "from pathweave.moe import _tables\n", private_violations),
        ("pathweave.bench.moe", "from pathweave import moe\nmoe._tables()\n", private_violations),
    ],
)
def test_rules_fire(monkeypatch, tmp_path, module, source, rule):
    fake = tmp_path / "m.py"
    fake.write_text(source)
    monkeypatch.setitem(MODULES, module, fake)
    assert any(v.startswith(f"{module}:") for v in rule())


def test_circle_fires(monkeypatch, tmp_path):
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text("from pathweave.plan import zz_b\n")
    b.write_text("def f():\n    pass\nfrom . import zz_a\n")
    monkeypatch.setitem(MODULES, "pathweave.plan.zz_a", a)
    monkeypatch.setitem(MODULES, "pathweave.plan.zz_b", b)
    assert ["pathweave.plan.zz_a", "pathweave.plan.zz_b"] in circles()


# ---------------------------------------------------------------- import-linter
PYPROJECT = SRC.parent / "pyproject.toml"


def contracts() -> list[dict]:
    """The ``[[tool.importlinter.contracts]]`` of pyproject.toml."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # import-linter brings tomli on Python 3.10
        import tomli as tomllib
    return tomllib.loads(PYPROJECT.read_text())["tool"]["importlinter"]["contracts"]


def lint_imports(src: Path) -> subprocess.CompletedProcess[str]:
    """``lint-imports`` with the project's contracts over the package in ``src``."""
    exe = Path(sys.executable).parent / "lint-imports"
    if not exe.exists():
        pytest.fail(
            f"import-linter is not installed next to {sys.executable}: it is in the test "
            "extras (pip install -e '.[test]', or bash scripts/setup.sh)"
        )
    env = {**os.environ, "PYTHONPATH": str(src)}
    return subprocess.run(
        [str(exe), str(PYPROJECT), "--no-cache", "--no-logo"],
        cwd=src, env=env, capture_output=True, text=True, timeout=300, check=False,
    )


def test_import_contracts_kept():
    result = lint_imports(SRC)
    assert result.returncode == 0, result.stdout + result.stderr


def test_contracts_cover_every_unit_and_private_module():
    """The contracts list what is on disk: every unit a layer, every private module protected."""
    found = contracts()
    (layers,) = [c for c in found if c["type"] == "layers"]
    named = {u.strip() for line in layers["layers"] for u in line.split(":")}
    assert named == set(LEVEL) - {"pathweave"}
    order = [frozenset(u.strip() for u in line.split(":")) for line in reversed(layers["layers"])]
    assert order == list(LAYERS[:-1])  # the same order as this file's LAYERS
    protected = {m for c in found if c["type"] == "protected" for m in c["protected_modules"]}
    private = {m for m in MODULES if _private(m) and unit(m) not in SHARED | {"_docgen"}}
    assert protected == private


def test_import_contracts_fire(tmp_path):
    """An upward import (closing a circle: cli imports fabric) and a private module used
    across units break their contracts."""
    shutil.copytree(PACKAGE, tmp_path / "pathweave", ignore=shutil.ignore_patterns("__pycache__"))
    with open(tmp_path / "pathweave" / "fabric" / "io.py", "a") as f:
        f.write("\n\ndef _up():\n    import pathweave.cli.main  # noqa\n")
    with open(tmp_path / "pathweave" / "bench" / "moe.py", "a") as f:
        f.write("\n\nfrom pathweave.moe import _pack  # noqa\n")
    result = lint_imports(tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    broken = {c["name"] for c in contracts() if f"{c['name']} BROKEN" in result.stdout}
    assert broken == {
        "pathweave layers: imports point down",
        "no import circle between the units of pathweave",
        "private modules of pathweave.moe stay in it",
    }, result.stdout


# ---------------------------------------------------------------- function length
#: The longest a function or method may be, decorators and docstring included
#: (issue 24: "no function over 150 lines").
MAX_FUNCTION_LINES = 150


def long_functions(limit: int = MAX_FUNCTION_LINES) -> list[str]:
    """``module:line name (N lines)`` for every function or method over ``limit`` lines."""
    out = []
    for module in MODULES:
        for node in ast.walk(_parse(module)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                first = min([node.lineno] + [d.lineno for d in node.decorator_list])
                length = node.end_lineno - first + 1
                if length > limit:
                    out.append(f"{module}:{node.lineno} {node.name} ({length} lines)")
    return out


def test_no_function_over_150_lines():
    assert long_functions() == []


def test_long_function_fires(monkeypatch, tmp_path):
    fake = tmp_path / "m.py"
    body = "".join(f"        x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES))
    fake.write_text(f"class C:\n    @staticmethod\n    def f():\n{body}")
    monkeypatch.setitem(MODULES, "pathweave.plan.zz_long", fake)
    assert long_functions() == ["pathweave.plan.zz_long:3 f (152 lines)"]


def unnamed_modules(doc: str) -> list[str]:
    """Modules of the package whose name (file stem) docs/architecture.md never writes."""
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        stem = path.stem
        if stem != "__init__" and not re.search(rf"(?<![\w.]){re.escape(stem)}(?!\w)", doc):
            out.append(str(path.relative_to(PACKAGE)))
    return out


def test_the_architecture_names_every_module():
    doc = (SRC.parent / "docs" / "architecture.md").read_text()
    assert unnamed_modules(doc) == []
    assert unnamed_modules(doc.replace("_limits", "")) == ["fabric/_limits.py"]
