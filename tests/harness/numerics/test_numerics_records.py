"""The run folder's typed records (harness/numerics/records.py): round trip, old shapes, clear errors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from numerics_helpers import harness, one_error_line, save

from harness.numerics.exc import RecordError, RunFolderError
from harness.numerics.records import (
    Entry,
    Manifest,
    OutputStats,
    ProgramKind,
    ProgramRecord,
    RunEnv,
    SideInfo,
    SideRecord,
    Storage,
    Structure,
)
from harness.numerics.store import RunFolder


def _entry(name: str, **extra: Any) -> dict[str, Any]:
    return {
        "file": f"sides/eager/r0/{name}.bin",
        "bytes": 16,
        "sha256": "ab" * 32,
        "digest": "ab" * 32,
        "shape": [2, 2],
        "dtype": "float32",
        **extra,
    }


MANIFEST: dict[str, Any] = {
    "schema": 1,
    "kind": "kiln-numerics-run",
    "created": "2026-01-01T00:00:00+00:00",
    "storage": {"full_max": 4, "sample": 2, "byteorder": "little"},
    "program": {
        "ref": "bf16_chain",
        "kind": "function",
        "inputs": ["x:bf16[2,2] randn"],
        "backward": False,
        "file_sha256": None,
        "structure": "elementwise",
        "row_dim": -1,
        "reduction": {"out": 64},
        "note": "a note",
    },
    "seed": 3,
    "device": "cpu",
    "inputs": {"x": _entry("x")},
    "input_order": ["x"],
    "cotangents": {},
    "sides": [
        {
            "compiler": "kiln",
            "error": None,
            "info": {"seconds": [0.5], "graphs": 1, "kernels": 2, "fallbacks": [], "future_key": 7},
            "repeats": [
                {
                    "out": _entry(
                        "out",
                        stored="full",
                        stats={
                            "count": 4,
                            "nan": 0,
                            "posinf": 0,
                            "neginf": 0,
                            "zeros": 1,
                            "min": 0.0,
                            "max": 2.0,
                            "mean": 1.0,
                            "std": 0.5,
                            "absmax": 2.0,
                        },
                    ),
                    "big": _entry(
                        "big",
                        stored="sample",
                        sample={"count": 2, "rule": "affine-v1"},
                        stats={"count": 9, "nan": 9, "posinf": 0, "neginf": 0, "zeros": 0},
                    ),
                }
            ],
        },
        {"compiler": "broken", "error": "RuntimeError: no", "info": {}, "repeats": []},
    ],
    "reference": {
        "out": _entry(
            "out", stored="full", stats={"count": 4, "nan": 0, "posinf": 0, "neginf": 0, "zeros": 0}
        )
    },
    "written_by_a_newer_harness": {"k": 1},
}


def test_manifest_round_trip():
    m = Manifest.from_dict(MANIFEST)
    assert m.to_dict() == MANIFEST
    assert m.program.structure is Structure.ELEMENTWISE and m.program.kind is ProgramKind.FUNCTION
    out, big = m.sides[0].repeats[0]["out"], m.sides[0].repeats[0]["big"]
    assert out.stored is Storage.FULL and not out.sampled and out.shape == (2, 2)
    assert big.sampled and big.sample is not None and big.sample.count == 2
    assert big.stats == OutputStats(count=9, nan=9)
    assert m.sides[0].info.kernels == 2 and m.sides[0].info.extra == {"future_key": 7}
    assert m.sides[1].error == "RuntimeError: no" and m.sides[1].repeats == []
    assert m.extra == {"written_by_a_newer_harness": {"k": 1}}
    assert m.program.reduction_length("out") == 64 and m.program.reduction_length("grad.x") is None


def test_manifest_of_the_old_shape_reads_with_defaults():
    """What older harnesses left out: input_order, storage, cotangents, a side's info and error, an entry's
    stored/stats, a program's kind, structure, row_dim, reduction and note."""
    old = {
        "schema": 1,
        "kind": "kiln-numerics-run",
        "program": {"ref": "mod:fn", "inputs": [], "backward": True},
        "seed": 0,
        "inputs": {"a": _entry("a"), "b": _entry("b")},
        "sides": [{"compiler": "eager", "repeats": [{"out": _entry("out")}]}],
    }
    m = Manifest.from_dict(old)
    assert m.input_order == ["a", "b"] and m.cotangents == {} and m.storage is None and m.device is None
    assert m.program == ProgramRecord("mod:fn")
    side = m.sides[0]
    assert side.error is None and side.info == SideInfo()
    entry = side.repeats[0]["out"]
    assert entry.stored is None and entry.stats is None and not entry.sampled


@pytest.mark.parametrize(
    "change, needle",
    [
        (
            lambda m: m["program"].update(structure="diagonal"),
            "program structure 'diagonal' is not one of elementwise, rows, opaque",
        ),
        (
            lambda m: m["program"].update(kind="script"),
            "program kind 'script' is not one of function, suite, export, suite-case",
        ),
        (lambda m: m["inputs"]["x"].pop("sha256"), "malformed entry"),
        (
            lambda m: m["sides"][0]["repeats"][0]["out"].update(stored="zipped"),
            "stored 'zipped' is not one of full, sample",
        ),
        (lambda m: m["sides"][0].pop("compiler"), "malformed side"),
        (lambda m: m["inputs"]["x"].update(bytes="many"), "malformed entry"),
    ],
)
def test_bad_manifest_values_are_one_clear_error(change, needle):
    bad = json.loads(json.dumps(MANIFEST))
    change(bad)
    with pytest.raises(RecordError, match=needle.replace("(", r"\(")):
        Manifest.from_dict(bad)


def test_side_and_entry_records_round_trip():
    info = SideInfo([0.1, 0.2], graphs=1, kernels=3, fallbacks=["aten.sort"], extra={"x": 1})
    assert SideInfo.from_dict(info.to_dict()) == info
    assert SideInfo().to_dict() == {}  # a side that failed before running writes no keys
    e = Entry(
        "f.bin", 8, "s", "d", (2,), "float32", Storage.FULL, None, OutputStats(count=2, min=1.0, max=2.0)
    )
    assert Entry.from_dict(e.to_dict()) == e
    side = SideRecord("kiln", [{"out": e}], None, info)
    assert SideRecord.from_dict(side.to_dict()) == side


def test_run_env_from_env_json():
    env = {
        "device": {"gpus": ["H100", "H100"], "torch": "2.13"},
        "host": {"git": {"sha": "abc", "dirty": True}},
    }
    assert RunEnv.from_dict(env) == RunEnv(gpus=["H100"], torch="2.13", git="abc", dirty=True)
    assert RunEnv.from_dict({}) == RunEnv() == RunEnv.from_dict(None)
    assert RunEnv.from_dict({"device": None, "host": {"git": None}}) == RunEnv()


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    base = tmp_path_factory.mktemp("records")
    return save(base / "a", ["eager"], repeat=2), save(base / "b", ["eager"])


def _strip_to_old_shape(run: Path) -> None:
    m = json.loads((run / "manifest.json").read_text())
    m.pop("input_order")
    m.pop("storage")
    for key in ("structure", "row_dim", "reduction", "note", "kind"):
        m["program"].pop(key)
    for side in m["sides"]:
        side.pop("info")
        for rep in side["repeats"]:
            for e in rep.values():
                e.pop("stats")
    (run / "manifest.json").write_text(json.dumps(m))


def test_a_run_folder_of_the_old_shape_compares_as_before(two_runs, tmp_path, capsys):
    """The same runs with their manifests cut to the old shape give the same comparison (less what the old
    shape did not record: the program's note)."""
    a, b = two_runs
    rc, _, err = harness(
        capsys, "numerics", "compare", a, b, "--json", tmp_path / "new.json", "--md", "/dev/null"
    )
    assert rc == 0, err
    old_a, old_b = shutil.copytree(a, tmp_path / "old" / "a"), shutil.copytree(b, tmp_path / "old" / "b")
    for run in (old_a, old_b):
        _strip_to_old_shape(run)
    assert RunFolder(old_a).program.structure is Structure.OPAQUE
    rc, _, err = harness(
        capsys, "numerics", "compare", old_a, old_b, "--json", tmp_path / "old.json", "--md", "/dev/null"
    )
    assert rc == 0, err
    new, old = (json.loads((tmp_path / f"{n}.json").read_text())["reports"][0] for n in ("new", "old"))
    assert [o["sides"] for o in old["outputs"]] == [o["sides"] for o in new["outputs"]]
    assert [o["pairs"] for o in old["outputs"]] == [
        [{**p, "worst": [{**w, "inputs": {}} for w in p["worst"]]} for p in o["pairs"]]
        for o in new["outputs"]
    ]  # without the recorded structure, the worst elements' inputs are not looked up (opaque)


def test_a_bad_manifest_value_is_one_line_exit_2(two_runs, tmp_path, capsys):
    a, b = two_runs
    bad = shutil.copytree(b, tmp_path / "bad")
    m = json.loads((bad / "manifest.json").read_text())
    m["program"]["structure"] = "diagonal"
    (bad / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(RunFolderError, match="manifest.json: program structure 'diagonal' is not one of"):
        RunFolder(bad)
    rc, _, err = harness(capsys, "numerics", "compare", a, bad)
    assert "program structure 'diagonal' is not one of elementwise, rows, opaque" in one_error_line(rc, err)
