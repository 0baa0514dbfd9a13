"""Typed, frozen settings loaded in layers: dataclass defaults, a TOML file, command-line flags.

Every stage owns one frozen dataclass of settings (declared next to the code that uses it). This
module holds the machinery they share:

* ``from_mapping(cls, data, where)`` builds a dataclass from a TOML table, rejecting unknown keys
  and wrong types with a message that names the setting and the file.
* ``add_arguments(parser, cls)`` turns every field into a ``--field-name`` flag (help text from the
  field's ``metadata["help"]``), and ``resolve(cls, args, table)`` merges defaults < TOML < flags.
* ``to_toml(tables)`` writes resolved settings back, so a run dir records what it ran with.

Supported field types: ``bool``, ``int``, ``float``, ``str``, ``tuple[str, ...]``,
``tuple[int, ...]`` and ``X | None`` of those.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import tomllib
import types
import typing
from collections.abc import Mapping
from typing import Any, TypeVar

from tpulm.errors import TpulmError

T = TypeVar("T")

SCALARS = (bool, int, float, str)
# The tables of a root config file (``tpulm run``); each stage's command reads its own from it.
TABLES = ("run", "tokenizer", "data", "model", "train", "evaluate", "plan")


def setting(default: Any, help: str, **kwargs: Any) -> Any:
    """A dataclass field with help text for ``--help``; tuples get an immutable default."""
    return dataclasses.field(default=default, metadata={"help": help, **kwargs})


def load_toml(path: str) -> dict[str, Any]:
    """Read a TOML file (local or any ``tf.io.gfile`` scheme) into a dict."""
    from tpulm.storage import read_text

    try:
        return tomllib.loads(read_text(path))
    except FileNotFoundError:
        raise TpulmError(f"config file {path} does not exist") from None
    except tomllib.TOMLDecodeError as err:
        raise TpulmError(f"config file {path} is not valid TOML: {err}") from None


def _field_types(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _unwrap_optional(tp: Any) -> tuple[Any, bool]:
    """``X | None`` -> (X, True); anything else -> (tp, False)."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0], True
    return tp, False


def _coerce(value: Any, tp: Any, name: str, where: str) -> Any:
    """Check ``value`` against the field type ``tp``; ints are accepted where floats are."""
    base, optional = _unwrap_optional(tp)
    if value is None:
        if optional:
            return None
        raise TpulmError(f"setting {name} in {where} must not be empty")
    if typing.get_origin(base) is tuple:
        item_tp = typing.get_args(base)[0]
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, (list, tuple)):
            raise TpulmError(f"setting {name} in {where} must be a list, got {value!r}")
        return tuple(_coerce(v, item_tp, name, where) for v in value)
    if base is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if base in SCALARS and (type(value) is not base):
        raise TpulmError(
            f"setting {name} in {where} must be of type {base.__name__}, got {value!r}"
        )
    if base is float and not math.isfinite(value):
        raise TpulmError(f"setting {name} in {where} must be a finite number, got {value!r}")
    return value


def check_choices(obj: Any) -> None:
    """Enforce the ``choices`` of every field of a settings dataclass; call it in ``__post_init__``."""
    for field in dataclasses.fields(obj):
        choices, value = field.metadata.get("choices"), getattr(obj, field.name)
        if choices and value is not None and value not in choices:
            raise TpulmError(
                f"{field.name} must be one of {', '.join(map(str, choices))}, got {value!r}")



def _named(name: str) -> str:
    """A setting as the user meets it: the TOML key and the flag (``seed (--seed)``)."""
    return f"{name} ({_flag(name)})"


def check_at_least(obj: Any, minimum: int, *names: str) -> None:
    """Every named setting of ``obj`` that is set (not None) is a number >= ``minimum``.

    Call it in ``__post_init__`` so the Python API checks what the CLI checks; NaN fails too.
    """
    for name in names:
        value = getattr(obj, name)
        if value is not None and not value >= minimum:
            raise TpulmError(f"{_named(name)} must be at least {minimum}, got {value}")


def check_fraction(obj: Any, *names: str, zero: bool = True, one: bool = True) -> None:
    """Every named setting of ``obj`` lies in [0, 1] (ends excluded with ``zero``/``one`` False).

    A percentage given as 15 instead of 0.15 would otherwise fail deep inside (``math domain
    error``) or silently select everything.
    """
    interval = f"{'[' if zero else '('}0, 1{']' if one else ')'}"
    for name in names:
        value = getattr(obj, name)
        low_ok = value >= 0 if zero else value > 0
        high_ok = value <= 1 if one else value < 1
        if not (low_ok and high_ok):  # NaN fails both
            raise TpulmError(f"{_named(name)} must be in {interval}, got {value}")

def from_mapping(cls: type[T], data: Mapping[str, Any], where: str) -> T:
    """Build ``cls`` from ``data``; unknown keys and wrong types are errors naming ``where``."""
    types_ = _field_types(cls)
    unknown = sorted(set(data) - set(types_))
    if unknown:
        known = ", ".join(sorted(types_))
        raise TpulmError(f"unknown setting(s) {', '.join(unknown)} in {where}; known: {known}")
    values = {k: _coerce(v, types_[k], k, where) for k, v in data.items()}
    try:
        return cls(**values)
    except (TypeError, ValueError, TpulmError) as err:  # a missing setting, or a failed check
        raise TpulmError(f"invalid settings in {where}: {err}") from None


def load_tables(path: str) -> dict[str, dict[str, Any]]:
    """The tables of a config file: any of ``TABLES``; another table is an error naming the file."""
    tables = load_toml(path)
    unknown = sorted(set(tables) - set(TABLES))
    if unknown:
        raise TpulmError(
            f"unknown table(s) {', '.join(unknown)} in {path}; known: {', '.join(TABLES)}")
    for name, table in tables.items():
        if not isinstance(table, dict):
            raise TpulmError(f"[{name}] in {path} must be a table")
    return tables


def from_args(cls: type[T], args: argparse.Namespace, table: str, **overrides: Any) -> T:
    """The one ``--config`` loader of the stage commands: defaults < the ``[table]`` of the file
    ``args.config`` (a stage file or a whole ``tpulm run`` config) < flags < ``overrides``."""
    path = getattr(args, "config", None)
    tables = load_tables(path) if path else {}
    where = f"[{table}] of {path}" if path else "the command line"
    return resolve(cls, args, tables.get(table, {}), where=where, **overrides)


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _parse_bool(text: str) -> bool:
    lowered = text.lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def add_arguments(
    parser: argparse.ArgumentParser, cls: type, *, skip: tuple[str, ...] = ()
) -> None:
    """Add one ``--flag`` per field of ``cls``; flags default to None (= not given)."""
    types_ = _field_types(cls)
    has_config = any("--config" in action.option_strings for action in parser._actions)
    title = f"{cls.__name__} settings" + (" (also from the --config TOML file)" if has_config else "")
    group = parser.add_argument_group(title)
    for field in dataclasses.fields(cls):
        if field.name in skip or field.metadata.get("cli") is False:
            continue
        base, _ = _unwrap_optional(types_[field.name])
        help_text = field.metadata.get("help", "")
        default = field.default if field.default is not dataclasses.MISSING else None
        help_text = f"{help_text} (default: {default!r})" if default not in (None, ()) else help_text
        kwargs: dict[str, Any] = {"dest": field.name, "default": None, "help": help_text}
        if typing.get_origin(base) is tuple:
            item = typing.get_args(base)[0]
            kwargs.update(nargs="+", type=item, metavar=field.name.upper())
        elif base is bool:
            kwargs.update(type=_parse_bool, nargs="?", const=True, metavar="BOOL")
        elif "choices" in field.metadata:  # no metavar: --help shows {a,b,c}
            kwargs.update(type=base, choices=field.metadata["choices"])
        else:
            kwargs.update(type=base, metavar=field.name.upper())
        group.add_argument(_flag(field.name), **kwargs)


def describe_table(table: str, cls: type, *, skip: tuple[str, ...] = ()) -> str:
    """``[table]`` and one line per setting of ``cls`` (name, default, help), for ``--help``."""
    lines = [f"[{table}]"]
    for field in dataclasses.fields(cls):
        if field.name in skip or field.metadata.get("cli") is False:
            continue
        default = field.default if field.default is not dataclasses.MISSING else None
        shown = "" if default in (None, ()) else f" (default: {default!r})"
        lines.append(f"  {field.name}: {field.metadata.get('help', '')}{shown}")
    return "\n".join(lines)


def resolve(
    cls: type[T],
    args: argparse.Namespace | None = None,
    table: Mapping[str, Any] | None = None,
    where: str = "the configuration",
    **overrides: Any,
) -> T:
    """Defaults < ``table`` (a TOML section) < flags given in ``args`` < keyword ``overrides``."""
    merged: dict[str, Any] = dict(table or {})
    names = {f.name for f in dataclasses.fields(cls)}
    if args is not None:
        merged.update(
            {k: v for k, v in vars(args).items() if k in names and v is not None}
        )
    merged.update({k: v for k, v in overrides.items() if v is not None})
    return from_mapping(cls, merged, where)


def as_table(obj: Any) -> dict[str, Any]:
    """A dataclass as a TOML-ready dict (tuples become lists, None values are left out)."""
    table = {}
    for field in dataclasses.fields(obj):
        value = getattr(obj, field.name)
        if value is None:
            continue
        table[field.name] = list(value) if isinstance(value, tuple) else value
    return table


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
        return f'"{escaped}"'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {value!r} to TOML")


def to_toml(tables: Mapping[str, Mapping[str, Any]]) -> str:
    """Write ``{section: {key: scalar-or-list}}`` as TOML text (enough for resolved configs)."""
    lines: list[str] = []
    for section, table in tables.items():
        lines.append(f"[{section}]")
        lines.extend(f"{key} = {_toml_value(value)}" for key, value in table.items())
        lines.append("")
    return "\n".join(lines)


def apply_overrides(tables: Mapping[str, Any], assignments: list[str]) -> dict[str, dict[str, Any]]:
    """``TABLE.KEY=VALUE`` assignments over ``{table: {key: value}}``; VALUE is read as TOML
    (``50``, ``true``, ``"x"``, ``["a", "b"]``), or taken as a plain string when it is not TOML."""
    merged = {name: dict(table) for name, table in tables.items()}
    for assignment in assignments:
        target, sep, text = assignment.partition("=")
        table, dot, key = target.strip().partition(".")
        if not (sep and dot and table and key):
            raise TpulmError(f"--set {assignment!r} must look like TABLE.KEY=VALUE, e.g. train.max_steps=50")
        try:
            value = tomllib.loads(f"value = {text}")["value"]
        except tomllib.TOMLDecodeError:
            value = text
        merged.setdefault(table, {})[key.strip()] = value
    return merged


def find_config(name_or_path: str) -> str:
    """A config file path, or the path of a preset shipped with tpulm (``demo``, ``reference`` ...).

    A name is a path only when it is a file: a folder called ``demo`` in the current directory
    does not hide the ``demo`` preset.
    """
    from importlib import resources

    from tpulm.storage import exists, isdir

    if exists(name_or_path) and not isdir(name_or_path):
        return name_or_path
    shipped = resources.files("tpulm") / "configs" / f"{name_or_path}.toml"
    if shipped.is_file():
        return str(shipped)
    names = sorted(p.name[: -len(".toml")] for p in (resources.files("tpulm") / "configs").iterdir()
                   if p.name.endswith(".toml"))
    raise TpulmError(f"config {name_or_path!r} is neither a file nor a preset ({', '.join(names)})")
