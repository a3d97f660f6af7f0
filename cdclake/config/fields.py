"""How a setting is declared and read: :func:`setting` puts its doc, bounds and reading rules on
the dataclass field, and :func:`read` reads one field from ``CDCLAKE_*`` variables.

The field's name is the variable (``max_depth`` is ``CDCLAKE_MAX_DEPTH``), its annotation the
type, its default the default: :mod:`cdclake.config.settings` declares each setting once, and
``load()``, ``.env.example`` and docs/settings.md are all read off the fields
(cdclake.dev.settingsdoc writes the two files).
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

PREFIX = "CDCLAKE_"


class SettingsError(ValueError):
    """A ``CDCLAKE_*`` variable has a value that cannot be used."""


@dataclasses.dataclass(frozen=True)
class Spec:
    """What a field's metadata says about its setting."""

    doc: str
    """One line for operators: what it does, and what its special values (0, empty) mean."""
    group: str
    """The section of docs/settings.md (and .env.example) it is listed under."""
    minimum: float | None = None
    """Lowest value a variable may give (numbers); keyword arguments of ``load()`` are trusted."""
    maximum: float | None = None
    """Highest value, checked after keyword arguments too; ``why_max`` says where it comes from."""
    why_max: str = ""
    form: tuple[str, Callable[[Any], bool]] | None = None
    """``(what it must be, test)`` for a text value, e.g. ``("sc://host:port or empty", ...)``."""
    derived: str = ""
    """A default computed from others: ``{root}`` (the repository), ``{home}`` (CDCLAKE_HOME) and
    ``{home_uri}`` (its ``file://`` URI) are filled in. The field then has no plain default."""
    keep_empty: bool = False
    """A variable set but empty means empty, not the default (a way to turn a default off)."""


def setting(
    default: Any = dataclasses.MISSING,
    *,
    doc: str,
    group: str,
    minimum: float | None = None,
    maximum: float | None = None,
    why_max: str = "",
    form: tuple[str, Callable[[Any], bool]] | None = None,
    derived: str = "",
    keep_empty: bool = False,
    secret: bool = False,
) -> Any:
    """A settings field; ``secret`` keeps the value out of ``repr`` (and marks it in the docs)."""
    spec = Spec(doc, group, minimum, maximum, why_max, form, derived, keep_empty)
    return dataclasses.field(default=default, repr=not secret, metadata={"setting": spec})


def spec(f: dataclasses.Field[Any]) -> Spec:
    found: Spec = f.metadata["setting"]
    return found


def variable(f: dataclasses.Field[Any]) -> str:
    return PREFIX + f.name.upper()


def default_of(f: dataclasses.Field[Any], places: Mapping[str, str]) -> Any:
    """The field's default; a derived one filled in from ``places`` (see :attr:`Spec.derived`)."""
    derived = spec(f).derived
    return derived.format(**places) if derived else f.default


def kind(annotation: Any) -> type:
    """The value type of an annotation: ``Path | None`` is ``Path`` (empty reads as None)."""
    if isinstance(annotation, types.UnionType):
        [inner] = [a for a in annotation.__args__ if a is not type(None)]
        return kind(inner)
    assert isinstance(annotation, type), annotation
    return annotation


def optional(annotation: Any) -> bool:
    return isinstance(annotation, types.UnionType) and type(None) in annotation.__args__


def read(f: dataclasses.Field[Any], annotation: Any, env: Mapping[str, str], default: Any) -> Any:
    """The field's value from ``env``: unset or empty is ``default`` (unless ``keep_empty``);
    a number below the minimum or text that is not one fails, naming the variable."""
    name, s = variable(f), spec(f)
    raw = env.get(name)
    t = kind(annotation)
    if t is bool:
        return _bool(name, raw, default)
    if t is int or t is float:
        return _number(name, raw, default, t, s.minimum)
    if s.keep_empty:
        return env.get(name, default)
    if optional(annotation):
        return t(raw).resolve() if raw else None
    value = raw or default
    return Path(value).resolve() if t is Path else value


def _number(name: str, raw: str | None, default: Any, t: type, minimum: float | None) -> Any:
    if raw is None or raw == "":
        return default
    try:
        value = t(raw)
    except ValueError:
        what = "an integer" if t is int else "a number"
        raise SettingsError(f"{name} must be {what}, got {raw!r}") from None
    floor = t(0 if minimum is None else minimum)
    if value < floor:
        raise SettingsError(f"{name} must be >= {floor}, got {value}")
    return value


def _bool(name: str, raw: str | None, default: bool) -> bool:
    text = (raw or "").strip().lower()
    if text == "":
        return default
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise SettingsError(f"{name} must be true or false, got {text!r}")


def check(f: dataclasses.Field[Any], value: Any) -> None:
    """The bounds that hold whatever gave the value (variable or keyword argument)."""
    s, name = spec(f), variable(f)
    if s.maximum is not None and value > s.maximum:
        why = f" ({s.why_max})" if s.why_max else ""
        raise SettingsError(f"{name} must be <= {s.maximum:g}{why}, got {value}")
    if s.form is not None and not s.form[1](value):
        raise SettingsError(f"{name} must be {s.form[0]}, got {str(value)!r}")
