"""The one spec grammar (pathweave._spec), through both of its users.

Each grammar error is provoked in a fabric spec and in a workload spec, and
both must raise their layer's error naming the spec (or its head) and
the offending item.
"""

from __future__ import annotations

import pytest

import pathweave as pw
from pathweave import _spec
from pathweave.errors import FabricError, WorkloadError

USERS = [
    pytest.param(pw.fabric.resolve, "dgx-h100", "nodes", "2", FabricError, id="fabric"),
    pytest.param(lambda s: pw.traffic.parse_workload(s, 8), "zipf", "seed", "3", WorkloadError,
                 id="workload"),
]


@pytest.mark.parametrize(("build", "head", "key", "value", "error"), USERS)
@pytest.mark.parametrize(("items", "needle"), [
    ("{k}={v},{k}={v}", "{k} given twice"),
    ("{k}={v},,{k}={v}", "has an empty item"),
    ("{k}=", "{k} has an empty value"),
    ("={v}", "item '={v}' has no key"),
    ("{k}=x{v}", "{k}='x{v}' is not a number"),
])
def test_grammar_errors_name_the_item(build, head, key, value, error, items, needle) -> None:
    spec = f"{head}:{items.format(k=key, v=value)}"
    with pytest.raises(error) as info:
        build(spec)
    assert needle.format(k=key, v=value) in str(info.value)
    assert head in str(info.value)


def test_keys_are_case_folded_only_where_the_caller_says() -> None:
    # Workload keys are case-insensitive, so SEED and seed are one key.
    with pytest.raises(WorkloadError, match="seed given twice"):
        pw.traffic.parse_workload("zipf:seed=1,SEED=2", 8)
    # Fabric keys are not (nic_Bps), so NODES is a different, unknown key.
    with pytest.raises(FabricError, match="NODES"):
        pw.fabric.resolve("dgx-h100:nodes=2,NODES=2")


def test_values_parse_the_same_in_both_layers() -> None:
    assert _spec.integer("1e4", "w", ValueError) == 10_000
    assert _spec.integer("16384.0", "w", ValueError) == 16384
    with pytest.raises(ValueError, match="w is not an integer"):
        _spec.integer("2.5", "w", ValueError)
    with pytest.raises(ValueError, match="w is not a finite number"):
        _spec.number("inf", "w", ValueError)
    assert pw.fabric.resolve("dgx-h100:nodes=4.0").num_ranks == 32
    assert pw.traffic.WorkloadSpec.parse("moe:tokens=1e4,hidden=64").params["tokens"] == 10_000


def test_spec_must_be_a_string() -> None:
    with pytest.raises(TypeError, match="got int 3"):
        _spec.split(3, "spec")  # type: ignore[arg-type]


@pytest.mark.parametrize("spec", ["moe", "moe:tokens=64", "moe:hidden=32,topk=1"])
def test_a_missing_required_key_shows_a_spec_that_works(spec: str) -> None:
    # the example the error offers is the spec as written plus the missing keys,
    # and it must build (a first spec to edit, not just the keys' names)
    with pytest.raises(WorkloadError, match=r"needs .* e\.g\. ") as exc:
        pw.traffic.parse_workload(spec, 8)
    example = str(exc.value).rsplit("e.g. ", 1)[1]
    assert example.startswith(spec)
    assert pw.traffic.parse_workload(example, 8).shape == (8, 8)
