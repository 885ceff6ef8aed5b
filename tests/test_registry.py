"""pathweave._registry.Registry against hand-written expectations."""

from __future__ import annotations

import inspect
import itertools
import sys
import textwrap

import pytest

from pathweave._registry import Registry
from pathweave.errors import FabricError, InputError, PlanError, WorkloadError


def test_duplicate_name_is_refused_with_the_registry_error():
    r = Registry("widget", error=PlanError)
    r.add("a", 1)
    with pytest.raises(PlanError, match=r"^widget 'a' is already registered$"):
        r.add("a", 2)
    assert r["a"] == 1  # the first stays
    one = object()
    r.add("b", one)
    assert r.add("b", one) is one  # the same entry again (a module imported twice): kept once
    assert list(r) == ["a", "b"]
    with pytest.raises(InputError, match="name must be a non-empty string"):
        Registry("widget").add("", 3)


def test_unknown_name_lists_known_and_suggests_the_closest():
    r = Registry("fabric preset", plural="presets", error=FabricError)
    for name in ("h100-2x4", "dgx-h100", "dgx-a100"):
        r.add(name, name)
    with pytest.raises(FabricError) as exc:
        r["dgx_h100"]  # '_' and '-' count as the same
    assert str(exc.value) == ("unknown fabric preset 'dgx_h100' (did you mean 'dgx-h100'?); "
                              "known presets: h100-2x4, dgx-h100, dgx-a100")
    with pytest.raises(FabricError) as exc:
        r["zzz"]
    assert str(exc.value) == ("unknown fabric preset 'zzz'; "
                              "known presets: h100-2x4, dgx-h100, dgx-a100")
    with pytest.raises(FabricError, match=r"unknown fabric preset \['x'\]"):
        r[["x"]]  # unhashable: still the registry's error
    assert r.get("zzz") is None and r.get(["x"], 5) == 5
    assert "zzz" not in r and ["x"] not in r


def test_order_is_registration_order_or_the_declared_modules():
    r = Registry("thing")
    for name in ("c", "a", "b"):
        r.add(name, 0)
    assert r.names() == list(r) == list(r.keys()) == ["c", "a", "b"]
    assert len(r) == 3 and dict(r.items()) == {"c": 0, "a": 0, "b": 0}
    # Declared modules fix the order whatever order they were imported in.
    m = Registry("thing", modules=("m.one", "m.two"))
    m.add("late", 0, module="m.two")
    m.add("x", 0, module=None)
    m.add("first", 0, module="m.one")
    m.add("second", 0, module="m.one")
    m._loaded = True  # the modules are stand-ins: nothing to import here
    assert m.names() == ["first", "second", "late", "x"]


@pytest.fixture
def plugins(tmp_path, monkeypatch):
    """A package ``regplug`` of three entry modules that register into ``regplug.REG``."""
    pkg = tmp_path / "regplug"
    (pkg / "entries").mkdir(parents=True)
    (pkg / "__init__.py").write_text(textwrap.dedent("""
        from pathweave._registry import Registry
        from pathweave.errors import WorkloadError
        REG = Registry("entry", plural="entries", error=WorkloadError, package="regplug.entries",
                       modules=("regplug.zfirst",))
        IMPORTED = []
    """))
    (pkg / "zfirst.py").write_text("import regplug\nregplug.IMPORTED.append('zfirst')\n"
                                   "regplug.REG.add('z', 26, module=__name__)\n")
    (pkg / "entries" / "__init__.py").write_text("")
    for stem, name in (("bee", "b"), ("ant", "a")):
        (pkg / "entries" / f"{stem}.py").write_text(
            f"import regplug\nregplug.IMPORTED.append({stem!r})\n"
            f"@regplug.REG.register({name!r})\ndef f():\n    return {name!r}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    for mod in [m for m in sys.modules if m == "regplug" or m.startswith("regplug.")]:
        del sys.modules[mod]


@pytest.mark.usefixtures("plugins")
def test_entry_modules_load_lazily_on_first_read():
    import regplug

    assert regplug.IMPORTED == []  # creating the registry imports nothing
    assert regplug.REG["a"]() == "a"
    # The declared module first, then the package's modules sorted by file name.
    assert regplug.IMPORTED == ["zfirst", "ant", "bee"]
    assert list(regplug.REG) == ["z", "a", "b"]
    with pytest.raises(WorkloadError, match=r"unknown entry 'c'.*known entries: z, a, b"):
        regplug.REG["c"]
    assert regplug.IMPORTED == ["zfirst", "ant", "bee"]  # loaded once


@pytest.mark.usefixtures("plugins")
def test_a_broken_entry_module_fails_each_read(tmp_path):
    import regplug

    (tmp_path / "regplug" / "entries" / "cat.py").write_text("raise RuntimeError('broken')\n")
    for _ in range(2):
        with pytest.raises(RuntimeError, match="broken"):
            regplug.REG.names()


# ------------------------------------------------------------ the package's registries
def test_every_plug_in_table_is_a_registry_in_its_documented_order():
    import pathweave as pw
    from pathweave.bench.paper import FIGURES
    from pathweave.cli._common import BENCHES
    from pathweave.fabric.presets import FORMATS, PRESETS
    from pathweave.sim.policies import POLICIES as DYNAMIC
    from pathweave.traffic.spec import _KINDS

    expected = [
        (pw.plan.POLICIES, ["static", "deepep", "multirail", "mwu", "optimal", "hscore",
                           "mwu_time", "mintime"]),
        (DYNAMIC, ["ecmp", "flowbender", "hopper", "nimble-online", "spray"]),
        (PRESETS, ["h100-2x4", "dgx-h100", "dgx-h200", "dgx-a100", "gb200-nvl72", "cluster"]),
        (FORMATS, ["nccl-xml", "nvidia-smi", "fabric"]),
        (_KINDS, ["uniform", "hotspot", "zipf", "moe", "many_to_few", "stencil", "random_sparse"]),
        (FIGURES, ["fig6", "fig7", "fig8", "table1", "hopper"]),
        (BENCHES, ["planner", "sim", "paper", "dataplane", "emulate", "moe", "hostcost"]),
    ]
    for registry, names in expected:
        assert isinstance(registry, Registry)
        assert list(registry) == names, registry.what


def test_topology_format_keys_are_the_readers_options():
    from pathweave.fabric.presets import FORMATS

    common = ("gpu", "nvlink_kind", "nvlink_Bps_per_link", "nic_Bps", "pcie_Bps")
    assert FORMATS["nccl-xml"].keys == ("nodes", *common, "name")
    assert FORMATS["nvidia-smi"].keys == ("nodes", *common, "nics_per_gpu", "name")
    assert FORMATS["fabric"].keys == ()


def test_bench_cli_has_one_command_per_registered_benchmark():
    from typer.main import get_command

    from pathweave.cli._common import BENCHES
    from pathweave.cli.main import app

    bench = get_command(app).commands["bench"]
    assert list(bench.commands) == list(BENCHES)
    for name, func in BENCHES.items():  # each command is its registered function
        assert inspect.cleandoc(bench.commands[name].help) == inspect.cleandoc(func.__doc__)


@pytest.mark.usefixtures("plugins")
def test_threads_reading_first_all_see_every_entry():
    import threading

    import regplug

    seen = []
    go = threading.Barrier(4)

    def read():
        go.wait()
        seen.append(regplug.REG.names())

    threads = [threading.Thread(target=read) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert seen == [["z", "a", "b"]] * 4
    assert regplug.IMPORTED == ["zfirst", "ant", "bee"]


def test_plan_baselines_follow_every_registration(monkeypatch):
    # baselines() keeps its answer between calls; a policy registered later
    # must still appear, in the listing order of the entries themselves.
    from pathweave.plan import registry as reg

    pols = reg.POLICIES
    pols.load()
    # a scratch copy: the test's policy leaves no trace
    for slot in ("_entries", "_order", "_derived"):
        monkeypatch.setattr(pols, slot, dict(getattr(pols, slot)))

    def listing(executable_only):
        return [n for n in pols.names()
                if pols[n].baseline and (pols[n].executable or not executable_only)]

    for flag in (False, True, False):
        assert reg.baselines(executable_only=flag) == listing(flag)
    reg.register("zz_scratch", baseline=True, summary="a test baseline")(
        lambda fabric, demand, paths: None)
    for flag in (False, True):
        assert reg.baselines(executable_only=flag) == listing(flag)
        assert reg.baselines(executable_only=flag)[-1] == "zz_scratch"
    assert reg.baselines() is not reg.baselines()  # a fresh list: callers may edit it


def test_every_op_registers_its_own_problem_codes_in_a_range_no_other_op_shares():
    import pathweave.moe  # noqa: F401  (registers the MoE layer's codes)
    from pathweave.runtime import protocol

    ranges = protocol.PROBLEM_RANGES
    assert set(ranges) == {"all_to_all_single", "all_to_all", "batch_isend_irecv",
                           "MoEAllToAll.dispatch", "MoEAllToAll.combine"}
    for code, (_, op, _) in protocol.PROBLEMS.items():
        assert code in ranges[op], (code, op)
    spans = sorted((r.start, r.stop) for r in ranges.values())
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans))
    with pytest.raises(ValueError, match=r"range\(50, 60\) of 'mine' overlap range\(40, 60\) "
                                         r"of 'batch_isend_irecv'"):
        protocol.register_problems("mine", range(50, 60), {})
    with pytest.raises(ValueError, match=r"\[300\] of 'mine' are outside its range"):
        protocol.register_problems("mine", range(200, 210), {300: (ValueError, "x")})
    assert "mine" not in ranges and 300 not in protocol.PROBLEMS  # nothing half-registered
    with pytest.raises(KeyError, match="unknown problem code 300"):
        protocol.ArgProblem(300)
