"""Settings declared once: each environment variable a field of a frozen dataclass, with its variable name,
type, default, parser and help text in that one declaration. The compiler (``compiler/config.py``) and the
harness (``harness/settings.py``) both declare their settings with it; standard library only, so the harness
reads the compiler's declarations without importing torch or triton.

Terms:
- *declaration*: ``field: T = setting(default, env="KILN_X", help="...", parse=..., choices=...)`` in a frozen
  dataclass. ``env`` defaults to ``<prefix><FIELD>`` (upper case) of the dataclass's reader.
- *parser*: a function of the raw string that returns the value or raises ValueError saying what it expected;
  the reader turns that into one line naming the variable and its value (``KILN_X='y': expected ...``).
- *derived default*: ``derive=f`` computes the default from the values read before it (``f(values)``), for
  defaults that depend on another setting (a folder below the results folder, say).
- *unset*: a variable absent from the environment, or (with ``empty_is_unset``) set to blanks.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")

_META = "kiln_setting"


@dataclasses.dataclass(frozen=True)
class Meta:
    """What a declaration adds to its dataclass field."""

    help: str
    env: str | None = None  # None: the reader's prefix + the field's name in upper case
    parse: Callable[[str], Any] | None = None  # None: by the field's type (bool, int, float, str, Path)
    choices: tuple[str, ...] = ()
    check: Callable[[Any], str | None] | None = (
        None  # what is wrong with a value (also for overrides), or None
    )
    derive: Callable[[dict[str, Any]], Any] | None = None
    default_doc: str | None = None  # the default as the docs show it (a derived or computed one)
    secret: bool = False  # never shown (docs show "set"/"unset", repr hides it)


def setting(
    default: Any = dataclasses.MISSING,
    *,
    help: str,
    env: str | None = None,
    parse: Callable[[str], Any] | None = None,
    choices: tuple[str, ...] = (),
    check: Callable[[Any], str | None] | None = None,
    derive: Callable[[dict[str, Any]], Any] | None = None,
    default_factory: Callable[[], Any] | None = None,
    default_doc: str | None = None,
    secret: bool = False,
) -> Any:
    """One setting's declaration (a dataclass field carrying its variable, parser and help)."""
    meta = {_META: Meta(help, env, parse, choices, check, derive, default_doc, secret)}
    if default_factory is not None:
        return dataclasses.field(default_factory=default_factory, metadata=meta, repr=not secret)
    if default is dataclasses.MISSING and derive is not None:
        return dataclasses.field(default=None, metadata=meta, repr=not secret)
    return dataclasses.field(default=default, metadata=meta, repr=not secret)


# ---- parsers: raw string -> value, or ValueError("expected ...") ---------------------------------------------


def boolean(raw: str) -> bool:
    """TRUE_WORDS or FALSE_WORDS, any case; blanks are false."""
    low = raw.strip().lower()
    if low in TRUE_WORDS:
        return True
    if low in FALSE_WORDS or not low:
        return False
    raise ValueError(f"expected a boolean: one of {'/'.join(TRUE_WORDS)} or {'/'.join(FALSE_WORDS)}")


def positive_int(raw: str) -> int:
    """An integer above zero."""
    try:
        value = int(raw)
    except ValueError:
        raise ValueError("expected an integer") from None
    if value <= 0:
        raise ValueError("expected a positive integer")
    return value


def count(raw: str) -> int:
    """A whole number, zero included."""
    if not raw.strip().isdigit():
        raise ValueError("expected a count (0, 1, 2, ...)")
    return int(raw.strip())


def number(raw: str) -> float:
    """A floating-point number."""
    try:
        return float(raw)
    except ValueError:
        raise ValueError("expected a number") from None


def text(raw: str) -> str:
    """The string without surrounding blanks."""
    return raw.strip()


def path(raw: str) -> Path:
    """A path, ``~`` expanded."""
    return Path(raw.strip()).expanduser()


def power_of_two(value: Any) -> str | None:
    """A check: None for a power of two, else what was expected."""
    return (
        None
        if isinstance(value, int) and value > 0 and not value & (value - 1)
        else "expected a power of two"
    )


_BY_TYPE: dict[str, Callable[[str], Any]] = {
    "bool": boolean,
    "int": positive_int,
    "float": number,
    "str": text,
    "Path": path,
}


def meta(f: dataclasses.Field) -> Meta:
    """The declaration of field `f` (TypeError for a field declared without ``setting``)."""
    m = f.metadata.get(_META)
    if m is None:
        raise TypeError(f"field {f.name} is not declared with setting()")
    return m


def declared(cls: type) -> Iterator[tuple[dataclasses.Field, Meta]]:
    """Every declared field of dataclass `cls`, in declaration order."""
    for f in dataclasses.fields(cls):
        if _META in f.metadata:
            yield f, f.metadata[_META]


def env_name(f: dataclasses.Field, prefix: str) -> str:
    """The variable that sets field `f`."""
    return meta(f).env or f"{prefix}{f.name.upper()}"


def _parser(f: dataclasses.Field, m: Meta) -> Callable[[str], Any]:
    if m.parse is not None:
        return m.parse
    kind = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
    return _BY_TYPE.get(kind.split(" |")[0].strip(), text)


def _problem(m: Meta, value: Any) -> str | None:
    if m.choices and value not in m.choices:
        return (
            f"expected {', '.join(m.choices[:-1])} or {m.choices[-1]}"
            if len(m.choices) > 1
            else f"expected {m.choices[0]}"
        )
    return m.check(value) if m.check is not None else None


def read(
    cls: type[T],
    env: Mapping[str, str],
    *,
    prefix: str = "",
    error: type[Exception] = ValueError,
    empty_is_unset: bool = True,
) -> T:
    """An instance of dataclass `cls` from `env`: each declared variable parsed and checked, else its default
    (or derived default). A bad value raises `error` with one line naming the variable and what it expects."""
    values: dict[str, Any] = {}
    for f, m in declared(cls):
        name = env_name(f, prefix)
        raw = env.get(name)
        if raw is not None and not (empty_is_unset and not raw.strip()):
            try:
                value = _parser(f, m)(raw)
                problem = _problem(m, value)
            except ValueError as e:
                problem = str(e)
            if problem:
                raise error(f"{name}={raw!r}: {problem}")
            values[f.name] = value
        elif m.derive is not None:
            values[f.name] = m.derive(values)
        elif f.default is not dataclasses.MISSING:
            values[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            values[f.name] = f.default_factory()
    return cls(**values)


def validate(obj: T, *, prefix: str = "", error: type[Exception] = ValueError) -> T:
    """`obj` when every declared field holds a value its declaration accepts (choices, check), else `error`
    naming the first that does not (for values set in code, e.g. a scoped override)."""
    for f, m in declared(type(obj)):
        problem = _problem(m, getattr(obj, f.name))
        if problem:
            raise error(f"{env_name(f, prefix)}={getattr(obj, f.name)!r}: {problem}")
    return obj


def replace(
    obj: T, overrides: Mapping[str, Any], *, prefix: str = "", error: type[Exception] = ValueError
) -> T:
    """`obj` with `overrides` (field names), checked; an unknown name raises `error`."""
    names = {f.name for f in dataclasses.fields(obj)}  # type: ignore[arg-type]
    unknown = sorted(set(overrides) - names)
    if unknown:
        raise error(f"unknown setting(s): {', '.join(unknown)}")
    return validate(dataclasses.replace(obj, **overrides), prefix=prefix, error=error)  # type: ignore[type-var]


def _default_text(f: dataclasses.Field, m: Meta) -> str:
    if m.default_doc is not None:
        return m.default_doc.replace("<", "&lt;")
    if m.secret:
        return "unset"
    if f.default is dataclasses.MISSING:
        return "computed"
    value = f.default
    if isinstance(value, bool):
        return "on" if value else "off"
    if value is None or value == "":
        return "unset"
    return f"`{value}`"


def _type_text(f: dataclasses.Field, m: Meta) -> str:
    if m.choices:
        return " \\| ".join(f"`{c}`" for c in m.choices)
    kind = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
    return kind.replace("|", "or")


def markdown(cls: type, prefix: str = "") -> str:
    """The declarations of `cls` as a markdown table: variable, type, default, meaning."""
    lines = ["| variable | type | default | meaning |", "|---|---|---|---|"]
    for f, m in declared(cls):
        cells = [
            f"`{env_name(f, prefix)}`",
            _type_text(f, m),
            _default_text(f, m),
            " ".join(m.help.split()).replace("|", "\\|"),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
