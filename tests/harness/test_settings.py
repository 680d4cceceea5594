"""harness/settings.py: every variable declared once (with compiler/envvars.py), read from the environment with
one-line errors, scoped overrides, and docs/settings.md generated from the declarations."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from compiler import envvars
from harness import settings as s
from harness.exc import SettingsError

ROOT = Path(__file__).resolve().parents[2]
CLASSES = (s.Settings, s.FleetSettings, s.BenchSettings)


def test_every_field_is_a_declared_variable_with_help():
    names = []
    for cls in CLASSES:
        for f in dataclasses.fields(cls):
            m = envvars.meta(f)  # TypeError for a field declared without setting()
            assert m.help.strip(), f.name
            names.append(envvars.env_name(f, ""))
    assert len(names) == len(set(names)), "a variable declared twice"
    assert {"KILN_NATIVE", "KILN_HISTORY_DB", "KILN_STORE_URL", "KILN_BENCH_PLANT"} <= set(names)


def test_values_and_derived_defaults(monkeypatch, tmp_path):
    monkeypatch.setenv("KILN_RESULTS", str(tmp_path / "r"))
    monkeypatch.delenv("KILN_LOGS", raising=False)
    monkeypatch.setenv("KILN_NATIVE", " On ")
    monkeypatch.setenv("KILN_HEARTBEAT_S", "2.5")
    monkeypatch.setenv("KILN_PRUNE_IMAGES", "")  # empty: unset, so the default (on)
    monkeypatch.setenv("KILN_TORCH_INDEX_URL", "http://torch.test/whl/")
    got = s.settings()
    assert got.results_root == tmp_path / "r" and got.logs_dir == tmp_path / "r" / "logs"
    assert got.native is True and got.heartbeat_s == 2.5 and got.prune_images is True
    assert got.torch_index_url == "http://torch.test/whl"
    monkeypatch.setenv("KILN_BENCH_BISECT_MAX", "0")
    monkeypatch.setenv("KILN_BENCH_PLANT", "softmax*@kiln=0.5")
    bench = s.bench_settings()
    assert bench.bisect_max == 0 and bench.plant == s.Plant("softmax*", "kiln", 0.5)


@pytest.mark.parametrize(
    "var, raw, line",
    [
        (
            "KILN_NATIVE",
            "maybe",
            "KILN_NATIVE='maybe': expected a boolean: one of 1/true/yes/on or 0/false/no/off",
        ),
        ("KILN_HEARTBEAT_S", "soon", "KILN_HEARTBEAT_S='soon': expected a number"),
        ("KILN_CONTAINER_USER", "root", "KILN_CONTAINER_USER='root': expected uid:gid (numbers) or `image`"),
        ("KILN_BENCH_BISECT_MAX", "-1", "KILN_BENCH_BISECT_MAX='-1': expected a count (0, 1, 2, ...)"),
    ],
)
def test_a_bad_value_is_one_line_naming_the_variable(monkeypatch, var, raw, line):
    monkeypatch.setenv(var, raw)
    with pytest.raises(SettingsError) as e:
        s.settings() if not var.startswith("KILN_BENCH") else s.bench_settings()
    assert str(e.value) == line


def test_override_is_scoped_and_rejects_unknown_names(monkeypatch):
    monkeypatch.delenv("KILN_NATIVE", raising=False)
    with s.override(native=True, strict=True, bisect_max=7):
        assert s.settings().native is True and s.fleet_settings().strict is True
        assert s.bench_settings().bisect_max == 7
        with s.override(native=False):
            assert s.settings().native is False
        assert s.settings().native is True
    assert s.settings().native is False and s.bench_settings().bisect_max == s.DEFAULT_BENCH_BISECT_MAX
    with pytest.raises(SettingsError, match="unknown harness setting"):
        with s.override(nativ=True):
            pass


def test_the_committed_docs_match_the_declarations():
    """docs/settings.md is `python -m harness settings --write`'s output: a declaration changed without the
    docs fails here."""
    assert (ROOT / s.DOCS).read_text() == s.docs_markdown(), "run `python -m harness settings --write`"


def test_the_docs_name_every_variable_of_the_harness_and_the_compiler(monkeypatch):
    from compiler import config

    monkeypatch.setenv(
        "KILN_CACHE_KEY", "s3cret-value"
    )  # the docs come from the declarations, never the values
    text = s.docs_markdown()
    for cls, prefix in (
        (s.Settings, ""),
        (s.FleetSettings, ""),
        (s.BenchSettings, ""),
        (config.Settings, "KILN_"),
    ):
        for f in dataclasses.fields(cls):
            assert f"| `{envvars.env_name(f, prefix)}` |" in text
    assert "s3cret-value" not in text and "| `KILN_CACHE_KEY` | str | unset |" in text
