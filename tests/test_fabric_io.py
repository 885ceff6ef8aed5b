"""Fabric files: exact round trips and precise errors for bad files."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import yaml

from pathweave.errors import FabricError, FabricFileError
from pathweave.fabric import io
from pathweave.fabric._core import Fabric
from pathweave.fabric.builders import cluster
from pathweave.fabric.presets import preset


def _degraded() -> Fabric:
    fab = preset("h100-2x4")
    return fab.with_links(
        {("n0.gpu0", "n0.gpu1"): 0.3, ("n1.nic2", "rail2"): 0.1},
        remove=[("n0.gpu2", "n0.gpu3"), ("n0.gpu3", "n0.gpu2")],
    )


FABRICS = {
    "h100-2x4": lambda: preset("h100-2x4"),
    "dgx-h100": lambda: preset("dgx-h100"),
    "cluster-mesh-spines": lambda: cluster(
        nodes=2, gpus_per_node=4, node_kind="nvlink-mesh", spines=2
    ),
    "degraded": _degraded,
}


@pytest.mark.parametrize("suffix", [".yaml", ".yml", ".json"])
@pytest.mark.parametrize("which", sorted(FABRICS))
def test_round_trip_is_exact(tmp_path: Path, which: str, suffix: str) -> None:
    fab = FABRICS[which]()
    path = io.save(fab, tmp_path / f"fab{suffix}")
    back = io.load(path)
    assert back == fab
    # Fabric.__eq__ already compares arrays; check bit patterns and meta too.
    assert back.capacity_Bps.tobytes() == fab.capacity_Bps.tobytes()
    assert back.latency_s.tobytes() == fab.latency_s.tobytes()
    assert back.meta == json.loads(json.dumps(io.to_dict(fab).get("meta", {})))
    assert back.name == fab.name
    # Saving the loaded fabric gives the same bytes: the writer is deterministic.
    again = io.save(back, tmp_path / f"again{suffix}")
    assert again.read_text() == path.read_text()


def test_round_trip_awkward_floats(tmp_path: Path) -> None:
    caps = [0.1 + 0.2, 1e16, 123456789.123456789, 5e-324 * 1e300, np.nextafter(50e9, 60e9)]
    fab = cluster(nodes=1, gpus_per_node=2, node_kind="nvlink-mesh")
    fab = Fabric(
        name="awkward: 'quoted' # not a comment",
        vertex_names=fab.vertex_names,
        vertex_kind=fab.vertex_kind,
        vertex_node=fab.vertex_node,
        link_src=fab.link_src,
        link_dst=fab.link_dst,
        link_kind=fab.link_kind,
        capacity_Bps=np.resize(np.array(caps), fab.num_links),
        latency_s=np.resize(np.array([1e-6, 2.5e-7, 0.0, 3.3e-9]), fab.num_links),
        meta={"tuple": (1, 2), "np": np.float64(0.1), "nested": {"k": [np.int32(3)]}},
    )
    for suffix in (".yaml", ".json"):
        back = io.load(io.save(fab, tmp_path / f"awkward{suffix}"))
        assert back == fab
        assert back.name == fab.name
        assert back.meta == {"tuple": [1, 2], "np": 0.1, "nested": {"k": [3]}}


def test_writer_uses_duplex_and_one_line_per_link(tmp_path: Path) -> None:
    fab = preset("dgx-h100")
    d = io.to_dict(fab)
    assert d["format"] == "pathweave-fabric" and d["version"] == 1
    assert all(link.get("duplex") for link in d["links"])
    assert len(d["links"]) * 2 == fab.num_links
    text = io.save(fab, tmp_path / "dgx.yaml").read_text()
    assert text.count("\n- {src:") == len(d["links"])
    assert yaml.safe_load(text)["links"][0] == d["links"][0]
    # Rails and spines carry no node key.
    assert {"name": "rail0", "kind": "rail"} in d["vertices"]


def test_save_is_atomic_and_replaces(tmp_path: Path) -> None:
    target = tmp_path / "fab.json"
    target.write_text("old contents")
    io.save(preset("h100-2x4"), target)
    assert io.load(target) == preset("h100-2x4")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fab.json"]


def test_save_rejects_unknown_suffix(tmp_path: Path) -> None:
    with pytest.raises(FabricFileError, match=r"fab\.toml.*unknown fabric file suffix '\.toml'"):
        io.save(preset("h100-2x4"), tmp_path / "fab.toml")
    assert list(tmp_path.iterdir()) == []


def test_save_creates_missing_folders(tmp_path: Path) -> None:
    target = tmp_path / "no" / "such" / "fab.yaml"
    assert io.load(io.save(preset("h100-2x4"), target)) == preset("h100-2x4")


@pytest.mark.parametrize("where", ["under-a-file", "a-folder.yaml"])
def test_save_refuses_what_is_not_a_regular_file(tmp_path: Path, where: str) -> None:
    (tmp_path / "file").write_text("x")
    (tmp_path / "a-folder.yaml").mkdir()
    target = tmp_path / ("file/f.yaml" if where == "under-a-file" else where)
    with pytest.raises(FabricFileError, match=r"not a directory|is a directory"):
        io.save(preset("h100-2x4"), target)


def test_from_dict_accepts_human_conveniences() -> None:
    d = {
        "format": "pathweave-fabric",
        "version": 1,
        "name": "pair",
        "vertices": [
            {"name": "n0.gpu0", "kind": "GPU", "node": 0},
            {"name": "n0.gpu1", "kind": "gpu", "node": 0},
            {"name": "n0.nic0", "kind": "nic", "node": 0},
            {"name": "rail0", "kind": "rail", "node": -1},
        ],
        "links": [
            {
                "src": "n0.gpu0",
                "dst": "n0.gpu1",
                "kind": "nvlink",
                "capacity_GBps": 120,
                "duplex": True,
            },
            {
                "src": "n0.gpu0",
                "dst": "n0.nic0",
                "kind": "pcie",
                "capacity_Bps": "63e9",
                "latency_s": 2e-6,
                "duplex": True,
            },
            {"src": "n0.nic0", "dst": "rail0", "kind": "network", "capacity_Bps": 50_000_000_000},
        ],
    }
    fab = io.from_dict(d)
    assert fab.num_links == 5
    assert fab.capacity_Bps[fab.link_id("n0.gpu1", "n0.gpu0")] == 120e9
    assert fab.capacity_Bps[fab.link_id("n0.nic0", "n0.gpu0")] == 63e9
    assert fab.latency_s[fab.link_id("n0.gpu1", "n0.gpu0")] == 1e-6
    assert fab.latency_s[fab.link_id("n0.nic0", "n0.gpu0")] == 2e-6


def test_load_accepts_hand_written_yaml(tmp_path: Path) -> None:
    path = tmp_path / "hand.yml"
    path.write_text(
        "format: pathweave-fabric\nversion: 1\nname: hand\n"
        "meta: {owner: me}\n"
        "vertices:\n"
        "  - {name: n0.gpu0, kind: gpu, node: 0}\n"
        "  - {name: n0.gpu1, kind: gpu, node: 0}\n"
        "  - {name: n0.host, kind: host, node: 0}\n"
        "links:\n"
        "  - {src: n0.gpu0, dst: n0.host, kind: pcie, capacity_GBps: 32, duplex: true}\n"
        "  - {src: n0.gpu1, dst: n0.host, kind: pcie, capacity_Bps: 32e9, duplex: true}\n"
    )
    fab = io.load(path)
    assert fab.nvlink_kind == "pcie"
    assert fab.meta == {"owner": "me"}
    assert np.all(fab.capacity_Bps == 32e9)


# ------------------------------------------------------------------ bad files
VERTS = "vertices:\n- {name: n0.gpu0, kind: gpu, node: 0}\n- {name: n0.gpu1, kind: gpu, node: 0}\n"
HEAD = "format: pathweave-fabric\nversion: 1\nname: bad\n"
GOOD_LINK = "- {src: n0.gpu0, dst: n0.gpu1, kind: nvlink, capacity_Bps: 1.0e+11, duplex: true}\n"


def _pattern(*fragments: str) -> str:
    """Regex matching the fragments in order: file name, key, bad value."""
    return "(?s)" + ".*".join(re.escape(f) for f in fragments)


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


BAD_YAML = {
    # case: (links text (after HEAD + VERTS), key, bad value)
    "negative-capacity": (
        "links:\n" + GOOD_LINK + "- {src: n0.gpu1, dst: n0.gpu0, kind: pcie, capacity_Bps: -5}\n",
        "links[1].capacity_Bps",
        "-5",
    ),
    "zero-capacity": (
        "links:\n- {src: n0.gpu0, dst: n0.gpu1, kind: nvlink, capacity_GBps: 0, duplex: true}\n",
        "links[0].capacity_GBps",
        "got 0",
    ),
    "capacity-not-a-number": (
        "links:\n- {src: n0.gpu0, dst: n0.gpu1, kind: nvlink, capacity_Bps: fast}\n",
        "links[0].capacity_Bps",
        "'fast'",
    ),
    "capacity-bool": (
        "links:\n- {src: n0.gpu0, dst: n0.gpu1, kind: nvlink, capacity_Bps: true}\n",
        "links[0].capacity_Bps",
        "True",
    ),
    "capacity-infinite": (
        "links:\n- {src: n0.gpu0, dst: n0.gpu1, kind: nvlink, capacity_Bps: .inf}\n",
        "links[0].capacity_Bps",
        "inf",
    ),
    "missing-capacity": (
        "links:\n- {src: n0.gpu0, dst: n0.gpu1, kind: nvlink}\n",
        "links[0].capacity_Bps",
        "missing required key 'capacity_Bps'",
    ),
    "missing-kind": (
        "links:\n- {src: n0.gpu0, dst: n0.gpu1, capacity_Bps: 1.0e+9}\n",
        "links[0].kind",
        "missing required key 'kind'",
    ),
    "negative-latency": (
        "links:\n- {src: n0.gpu0, dst: n0.gpu1, kind: nvlink, capacity_Bps: 1.0e+9, "
        "latency_s: -1.0e-6, duplex: true}\n",
        "links[0].latency_s",
        "-1e-06",
    ),
    "duplex-not-bool": (
        "links:\n- {src: n0.gpu0, dst: n0.gpu1, kind: nvlink, capacity_Bps: 1.0e+9, "
        "duplex: maybe}\n",
        "links[0].duplex",
        "'maybe'",
    ),
    "unknown-vertex": (
        "links:\n" + GOOD_LINK + "- {src: n0.gpu0, dst: n0.gpu9, kind: nvlink, capacity_Bps: 1}\n",
        "links[1].dst",
        "'n0.gpu9'",
    ),
    "unknown-link-kind": (
        "links:\n- {src: n0.gpu0, dst: n0.gpu1, kind: optical, capacity_Bps: 1.0e+9}\n",
        "links[0].kind",
        "'optical'",
    ),
    "unknown-link-key": (
        "links:\n- {src: n0.gpu0, dst: n0.gpu1, kind: nvlink, capacity_bps: 1.0e+9}\n",
        "links[0].capacity_bps",
        "'capacity_bps'",
    ),
    "duplicate-link": (
        "links:\n"
        + GOOD_LINK
        + "- {src: n0.gpu1, dst: n0.gpu0, kind: nvlink, capacity_Bps: 5.0e+10}\n",
        "links[1]",
        "duplicate link n0.gpu1 -> n0.gpu0",
    ),
    "duplicate-link-by-duplex": (
        "links:\n- {src: n0.gpu1, dst: n0.gpu0, kind: nvlink, capacity_Bps: 5.0e+10}\n" + GOOD_LINK,
        "links[1]",
        "duplicate link n0.gpu1 -> n0.gpu0 in links[1] (reverse direction added by duplex)",
    ),
    "self-loop": (
        "links:\n- {src: n0.gpu0, dst: n0.gpu0, kind: nvlink, capacity_Bps: 5.0e+10}\n",
        "links[0].dst",
        "'n0.gpu0'",
    ),
    "links-not-a-list": ("links: {a: 1}\n", "links", "{'a': 1}"),
}


@pytest.mark.parametrize("case", sorted(BAD_YAML))
def test_bad_link_entries(tmp_path: Path, case: str) -> None:
    links, key, value = BAD_YAML[case]
    path = _write(tmp_path, f"{case}.yaml", HEAD + VERTS + links)
    with pytest.raises(FabricFileError, match=_pattern(str(path), f"key '{key}'", value)):
        io.load(path)


BAD_VERTICES = {
    "duplicate-vertex": (
        VERTS + "- {name: n0.gpu1, kind: gpu, node: 0}\n",
        "vertices[2].name",
        "duplicate vertex 'n0.gpu1' (first defined at vertices[1])",
    ),
    "unknown-vertex-kind": (
        VERTS + "- {name: n0.tpu0, kind: tpu, node: 0}\n",
        "vertices[2].kind",
        "'tpu'",
    ),
    "node-wrong-type": (
        VERTS + "- {name: n0.nic0, kind: nic, node: zero}\n",
        "vertices[2].node",
        "'zero'",
    ),
    "node-missing": (
        VERTS + "- {name: n0.nic0, kind: nic}\n",
        "vertices[2].node",
        "missing required key 'node'",
    ),
    "node-negative": (
        VERTS + "- {name: n0.nic0, kind: nic, node: -1}\n",
        "vertices[2].node",
        "got -1",
    ),
    "rail-with-node": (
        VERTS + "- {name: rail0, kind: rail, node: 0}\n",
        "vertices[2].node",
        "got 0",
    ),
    "name-not-string": (
        VERTS + "- {name: 7, kind: gpu, node: 0}\n",
        "vertices[2].name",
        "got 7",
    ),
    "vertex-not-mapping": (VERTS + "- n0.gpu2\n", "vertices[2]", "'n0.gpu2'"),
    "vertices-empty": ("vertices: []\n", "vertices", "got []"),
}


@pytest.mark.parametrize("case", sorted(BAD_VERTICES))
def test_bad_vertex_entries(tmp_path: Path, case: str) -> None:
    verts, key, value = BAD_VERTICES[case]
    path = _write(tmp_path, f"{case}.yaml", HEAD + verts + "links:\n" + GOOD_LINK)
    with pytest.raises(FabricFileError, match=_pattern(str(path), f"key '{key}'", value)):
        io.load(path)


BAD_TOP = {
    "missing-format": ("version: 1\nname: x\n" + VERTS + "links: []\n", "format", "missing"),
    "wrong-format": (
        "format: other\nversion: 1\nname: x\n" + VERTS + "links: []\n",
        "format",
        "'other'",
    ),
    "future-version": (
        "format: pathweave-fabric\nversion: 2\nname: x\n" + VERTS + "links: []\n",
        "version",
        "unsupported version 2",
    ),
    "missing-name": (
        "format: pathweave-fabric\nversion: 1\n" + VERTS + "links: []\n",
        "name",
        "missing required key 'name'",
    ),
    "missing-links": (HEAD + VERTS, "links", "missing required key 'links'"),
    "unknown-top-key": (HEAD + VERTS + "links: []\nlink: []\n", "link", "unknown key 'link'"),
    "meta-not-mapping": (HEAD + "meta: [1, 2]\n" + VERTS + "links: []\n", "meta", "[1, 2]"),
}


@pytest.mark.parametrize("case", sorted(BAD_TOP))
def test_bad_top_level(tmp_path: Path, case: str) -> None:
    text, key, value = BAD_TOP[case]
    path = _write(tmp_path, f"{case}.yaml", text)
    with pytest.raises(FabricFileError, match=_pattern(str(path), f"key '{key}'", value)):
        io.load(path)


def test_document_not_a_mapping(tmp_path: Path) -> None:
    path = _write(tmp_path, "list.yaml", "- a\n- b\n")
    with pytest.raises(
        FabricFileError, match=_pattern(str(path), "must be a mapping", "['a', 'b']")
    ):
        io.load(path)


def test_malformed_yaml_names_line(tmp_path: Path) -> None:
    path = _write(tmp_path, "broken.yaml", HEAD + "vertices: [\n  {name: n0.gpu0, kind: gpu\n")
    with pytest.raises(FabricFileError, match=_pattern(str(path), "malformed YAML at line 6")):
        io.load(path)


def test_malformed_json_names_line(tmp_path: Path) -> None:
    path = _write(tmp_path, "broken.json", '{"format": "pathweave-fabric",\n "version": 1,,\n}')
    with pytest.raises(
        FabricFileError, match=_pattern(str(path), "malformed JSON at line 2, column 15")
    ):
        io.load(path)


def test_json_errors_name_keys_too(tmp_path: Path) -> None:
    d = io.to_dict(preset("h100-2x4"))
    d["links"][3]["capacity_Bps"] = -1.5
    path = _write(tmp_path, "neg.json", json.dumps(d))
    with pytest.raises(
        FabricFileError, match=_pattern(str(path), "key 'links[3].capacity_Bps'", "-1.5")
    ):
        io.load(path)


def test_unreachable_gpu_pair(tmp_path: Path) -> None:
    # Two GPUs with no link at all: Fabric accepts it, the path compiler does not.
    path = _write(tmp_path, "island.yaml", HEAD + VERTS + "links: []\n")
    with pytest.raises(FabricFileError, match=_pattern(str(path), "no path from rank 0")) as ei:
        io.load(path)
    assert isinstance(ei.value.__cause__, FabricError)


def test_fabric_validation_errors_carry_the_path(tmp_path: Path) -> None:
    # An NVLink between two nodes passes the schema but not Fabric's rules.
    text = (
        HEAD
        + "vertices:\n- {name: n0.gpu0, kind: gpu, node: 0}\n"
        + "- {name: n1.gpu0, kind: gpu, node: 1}\n"
        + "links:\n- {src: n0.gpu0, dst: n1.gpu0, kind: nvlink, capacity_Bps: 1.0e+9}\n"
    )
    path = _write(tmp_path, "cross.yaml", text)
    with pytest.raises(FabricFileError, match=_pattern(str(path), "n0.gpu0 -> n1.gpu0", "nvlink")):
        io.load(path)
    # A GPU with a name that breaks the rank map.
    text = HEAD + "vertices:\n- {name: gpu0, kind: gpu, node: 0}\nlinks: []\n"
    path = _write(tmp_path, "badname.yaml", text)
    with pytest.raises(FabricFileError, match=_pattern(str(path), "'gpu0'", "n<node>.gpu<index>")):
        io.load(path)


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.yaml"
    with pytest.raises(FabricFileError, match=_pattern(str(path), "cannot read")):
        io.load(path)


def test_from_dict_without_source_still_names_key() -> None:
    d = io.to_dict(preset("h100-2x4"))
    d["vertices"][0]["kind"] = "cpu"
    with pytest.raises(FabricFileError, match=_pattern("key 'vertices[0].kind'", "'cpu'")):
        io.from_dict(d)


def test_saved_files_get_umask_permissions_and_no_temp_left(tmp_path):
    import os
    import stat

    mask = os.umask(0o022)
    try:
        path = io.save(preset("h100-2x4"), tmp_path / "f.yaml")
    finally:
        os.umask(mask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert [p.name for p in tmp_path.iterdir()] == ["f.yaml"]
