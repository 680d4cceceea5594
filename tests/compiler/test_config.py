"""compiler.config: env parsing, validation errors and scoped overrides."""

import pytest

from compiler import config
from compiler.exc import ConfigError


def test_defaults_and_env_parsing():
    s = config.from_env({"KILN_STRICT": "yes", "KILN_POINTWISE_XBLOCK": "512", "KILN_DUMP_DIR": "/tmp/x"})
    assert s.strict is True and s.pointwise_xblock == 512 and s.dump_dir == "/tmp/x"
    assert config.from_env({}).interpret == "auto"


@pytest.mark.parametrize(
    "env, needle",
    [
        ({"KILN_STRICT": "maybe"}, "KILN_STRICT"),
        ({"KILN_POINTWISE_XBLOCK": "abc"}, "expected an integer"),
        ({"KILN_POINTWISE_XBLOCK": "1000"}, "power of two"),
        ({"KILN_OUTER_XBLOCK": "48"}, "power of two"),
        ({"KILN_POINTWISE_XBLOCK": "-4"}, "positive"),
        ({"KILN_INTERPRET": "sometimes"}, "auto, 0 or 1"),
        ({"KILN_COMPILE_WORKERS": "0"}, "KILN_COMPILE_WORKERS=.*positive"),
    ],
)
def test_bad_values_name_the_variable(env, needle):
    with pytest.raises(ConfigError, match=needle):
        config.from_env(env)


def test_compile_threads_and_workers():
    s = config.from_env({"KILN_COMPILE_THREADS": "4", "KILN_COMPILE_WORKERS": "3"})
    assert (s.compile_threads, s.compile_workers) == (4, 3)
    default = config.from_env({})
    assert default.compile_workers == min(32, config.usable_cpus())
    assert default.compile_threads == default.compile_workers


@pytest.mark.parametrize("cpus, workers", [(1, 1), (2, 2), (16, 16), (32, 32), (128, 32)])
def test_default_workers_follow_the_usable_cpus_up_to_inductors_cap(monkeypatch, cpus, workers):
    """As many compile workers as CPUs this process may use (its affinity, not the machine's count), at most 32."""
    monkeypatch.setattr(config.os, "sched_getaffinity", lambda pid: set(range(cpus)), raising=False)
    monkeypatch.setattr(config.os, "cpu_count", lambda: 256)
    assert config.usable_cpus() == cpus
    assert config.from_env({}).compile_workers == workers


def test_usable_cpus_without_affinity_is_the_cpu_count(monkeypatch):
    monkeypatch.delattr(config.os, "sched_getaffinity", raising=False)
    monkeypatch.setattr(config.os, "cpu_count", lambda: 6)
    assert config.usable_cpus() == 6


def test_patch_is_scoped_and_rejects_unknown_fields():
    before = config.settings().strict
    with config.patch(strict=not before) as s:
        assert s.strict is (not before)
        assert config.settings().strict is (not before)
    assert config.settings().strict is before
    with pytest.raises(ConfigError, match="unknown kiln setting"):
        with config.patch(no_such_knob=1):
            pass
