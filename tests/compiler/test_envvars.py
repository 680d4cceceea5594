"""compiler/envvars.py: declarations read, checked and documented from one place."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from compiler import envvars
from compiler.envvars import setting


@dataclasses.dataclass(frozen=True)
class Knobs:
    size: int = setting(64, check=envvars.power_of_two, help="Block size.")
    mode: str = setting("fast", choices=("fast", "slow"), help="How.")
    on: bool = setting(False, help="A flag.")
    folder: Path = setting(derive=lambda v: Path("/base") / v["mode"], env="X_FOLDER", help="Where.")
    token: str = setting("", secret=True, help="A secret.")


def test_defaults_values_and_derived_defaults():
    assert envvars.read(Knobs, {}, prefix="X_") == Knobs(64, "fast", False, Path("/base/fast"), "")
    got = envvars.read(Knobs, {"X_SIZE": "128", "X_MODE": "slow", "X_ON": "yes"}, prefix="X_")
    assert (got.size, got.mode, got.on, got.folder) == (128, "slow", True, Path("/base/slow"))
    assert envvars.read(Knobs, {"X_FOLDER": "~/f"}, prefix="X_").folder == Path("~/f").expanduser()


@pytest.mark.parametrize(
    "env, line",
    [
        ({"X_SIZE": "48"}, "X_SIZE='48': expected a power of two"),
        ({"X_SIZE": "x"}, "X_SIZE='x': expected an integer"),
        ({"X_MODE": "medium"}, "X_MODE='medium': expected fast or slow"),
        ({"X_ON": "perhaps"}, "X_ON='perhaps': expected a boolean: one of 1/true/yes/on or 0/false/no/off"),
    ],
)
def test_bad_values_are_one_line(env, line):
    with pytest.raises(KeyError) as e:
        envvars.read(Knobs, env, prefix="X_", error=KeyError)
    assert e.value.args[0] == line


def test_empty_values_are_unset_or_values_as_asked():
    assert envvars.read(Knobs, {"X_ON": " "}, prefix="X_").on is False
    with pytest.raises(ValueError, match="X_SIZE='': expected an integer"):
        envvars.read(Knobs, {"X_SIZE": ""}, prefix="X_", empty_is_unset=False)
    assert envvars.read(Knobs, {"X_SIZE": ""}, prefix="X_").size == 64


def test_replace_checks_the_overrides():
    base = envvars.read(Knobs, {}, prefix="X_")
    assert envvars.replace(base, {"size": 256}).size == 256
    with pytest.raises(ValueError, match="X_SIZE=100: expected a power of two"):
        envvars.replace(base, {"size": 100}, prefix="X_")
    with pytest.raises(ValueError, match="unknown setting"):
        envvars.replace(base, {"sise": 1})


def test_markdown_hides_secrets_and_names_choices():
    table = envvars.markdown(Knobs, "X_")
    assert "| `X_MODE` | `fast` \\| `slow` | `fast` | How. |" in table
    assert "| `X_TOKEN` | str | unset | A secret. |" in table and "repr" not in repr(Knobs()).lower().replace(
        "token", ""
    )
    assert "token" not in repr(Knobs(token="hidden")) and "hidden" not in repr(Knobs(token="hidden"))
