"""Where a run's settings come from: defaults, then a TOML file, then flags.

    cfg = config_from("run.toml", {"echo_factor": "auto"})   # the file, then overrides

The settings are one list (:func:`options`): each a keyword of ``TrainConfig``, a flag and a
TOML key. Text is parsed here and each value checked once, by ``TrainConfig``; an error names
the flag or the file key it came from, the value seen and the valid range.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Iterator, Mapping
from dataclasses import MISSING, dataclass
from pathlib import Path
from typing import Any

from dataecho._validate import Check
from dataecho.app import workloads
from dataecho.app.config import TrainConfig, did_you_mean
from dataecho.app.loader_settings import (
    LOADER_FIELDS,
    LOADER_GROUPS,
    LOADER_KEYS,
    RUN_DEFAULTS,
    loader_check,
)
from dataecho.app.workloads.base import DEFAULTED
from dataecho.errors import DataechoError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover (pyproject pulls tomli in for 3.10)
    import tomli as tomllib


class ConfigError(DataechoError, ValueError):
    """A bad key or value in a config file or on the command line; the message says which."""


@dataclass(frozen=True)
class Option:
    """One setting of a run: a keyword of :class:`TrainConfig`, a flag and a TOML key."""

    name: str
    default: Any
    check: Check
    group: str
    help: str

    @property
    def metadata(self) -> dict[str, Any]:
        """``check``, ``group`` and ``help`` as a mapping, as dataclass field metadata."""
        return {"check": self.check, "group": self.group, "help": self.help}


def _help(name: str, text: str) -> str:
    """``text``, and the workloads' defaults of a setting that has them."""
    if name not in DEFAULTED:
        return text
    each = (f"{w.defaults[name]:,} for {w.name}" for w in workloads.REGISTRY.values())
    return f"{text} (default: {', '.join(each)})"


def _loader_option(f: dataclasses.Field) -> Option:
    default = None if f.default is MISSING or f.name in RUN_DEFAULTS else f.default
    text = _help(f.name, f.metadata["help"])
    if f.name in RUN_DEFAULTS:
        text = f"{text} (default: {RUN_DEFAULTS[f.name]})"
    return Option(f.name, default, loader_check(f.name), LOADER_GROUPS.get(f.name, "echoing"),
                  text)  # fmt: skip


def _options() -> Iterator[Option]:
    for f in dataclasses.fields(TrainConfig):
        if f.name == "loader":
            yield from (_loader_option(LOADER_FIELDS[name]) for name in LOADER_KEYS)
        else:
            meta = f.metadata
            yield Option(f.name, f.default, meta["check"], meta["group"],
                         _help(f.name, meta["help"]))  # fmt: skip


_OPTIONS = tuple(_options())
_OPTION = {o.name: o for o in _OPTIONS}


def options() -> list[Option]:
    """The settings of :class:`TrainConfig` in order (the loader's flat, where ``loader``
    stands): one flag and one TOML key each."""
    return list(_OPTIONS)


def flag(name: str) -> str:
    """The command-line flag of a field: ``echo_factor`` -> ``--echo-factor``."""
    return "--" + name.replace("_", "-")


def read_toml(path: str | Path) -> dict[str, Any]:
    """``{field name: value}`` from a TOML file; an unknown key is an error naming it."""
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as err:
        raise ConfigError(f"{path}: not a readable TOML file: {err}") from None
    names = [o.name for o in options()]
    out: dict[str, Any] = {}
    try:
        entries = list(_toml_entries(raw, names))
    except ConfigError as err:
        raise ConfigError(f"{path}: {err}") from None
    for key, value, valid in entries:
        name = key.replace("-", "_").removeprefix("loader.")
        if name not in valid and name in names:  # a run setting inside [loader]
            raise ConfigError(
                f"{path}: unknown key {key!r}: {name} is a setting of the run, not of its "
                "loader; move it above the [loader] table"
            )
        if name not in valid:
            raise ConfigError(f"{path}: unknown key {key!r}; {did_you_mean(name, valid)}")
        if name in out:
            raise ConfigError(f"{path}: key {name!r} is given twice (flat and in [loader])")
        out[name] = value
    return out


def _toml_entries(raw: dict[str, Any], names: list[str]) -> Iterator[tuple[str, Any, list[str]]]:
    """``(key, value, valid names)``: top-level keys, and those of a ``[loader]`` table."""
    for key, value in raw.items():
        if key == "loader" and isinstance(value, dict):
            yield from ((f"loader.{k}", v, list(LOADER_KEYS)) for k, v in value.items())
        elif key == "loader":  # the table's name given a value: say what the table is
            raise ConfigError(
                f"key 'loader' must be a table of the loader's settings, got {value!r} "
                f"({_toml_type(value)}); write them under a [loader] line (e.g. echo-factor = 4) "
                "or at the top level"
            )
        else:
            yield key, value, names


def _toml_type(value: Any) -> str:
    """The TOML kind of a parsed value, for a message: "an array", "a table", "an integer"."""
    kinds = ((bool, "a boolean"), (int, "an integer"), (float, "a float"), (str, "a string"),
             (list, "an array"), (dict, "a table"))  # fmt: skip
    return next((word for kind, word in kinds if isinstance(value, kind)), "a date or time")


def config_from(
    toml_path: str | Path | None = None,
    overrides: Mapping[str, Any] | None = None,
    *,
    defaults: Mapping[str, Any] | None = None,
    cli_targets: bool = False,
) -> TrainConfig:
    """A config from ``defaults``, then a TOML file, then ``overrides`` (flags; text is parsed).

    Each value is checked on its own first, so an error names the flag or the file key it came
    from. ``cli_targets``: a workload whose target is given nowhere gets its ``cli_target``.
    """
    given: dict[str, tuple[Any, str]] = {}  # name -> (value, where it came from)
    for name, value in (defaults or {}).items():
        given[name] = (value, f"default {name}")
    if toml_path is not None:
        for name, value in read_toml(toml_path).items():
            given[name] = (value, f"{toml_path}: key {name.replace('_', '-')!r}")
    for name, value in (overrides or {}).items():
        given[name] = (value, flag(name))
    checks = {o.name: o.check for o in options()}
    values = {}
    for name, (value, origin) in given.items():  # text is parsed here; TrainConfig checks
        try:
            values[name] = checks[name].parse(value) if isinstance(value, str) else value
        except (TypeError, ValueError) as err:
            raise ConfigError(f"{origin}: {err}") from None
        if isinstance(value, (list, tuple, dict, set)):  # no setting takes a collection
            raise ConfigError(f"{origin}: {_one_value(_OPTION[name], value)}")
    if cli_targets:
        chosen = values.get("workload", "cnn")  # a str here: collections were refused above
        workload = workloads.REGISTRY.get(chosen) if isinstance(chosen, str) else None
        if workload is not None and workload.target_key not in given:
            values[workload.target_key] = workload.cli_target
    try:
        return TrainConfig(**values)
    except DataechoError as err:  # anything else is a bug in the config: its traceback shows
        # A value's own check names its setting: say where the value came from.
        origin = given.get(getattr(err, "setting", ""), (None, None))[1]
        raise ConfigError(f"{origin}: {err}" if origin else str(err)) from None


def _one_value(option: Option, value: Any) -> str:
    """The message for a collection (a TOML array or table) given to a one-value setting: the
    check's own words for what is valid, and the fix."""
    name, check = option.name, option.check
    try:
        check.check(name, value)
    except DataechoError as err:  # the check's own message names the valid values
        valid = str(err)
    except (TypeError, ValueError):  # a check that does not expect a collection at all
        valid = f"{name} must be {check.describe() or 'a single ' + check.metavar}, got {value!r}"
    else:
        valid = f"{name} takes a single value, got {value!r}"
    kind = "a table" if isinstance(value, dict) else "an array"
    default = option.default
    example = (
        f"{flag(name)[2:]} = {default!r}".replace("'", '"').replace("True", "true")
        .replace("False", "false")
        if isinstance(default, (bool, int, float, str)) and default != ""
        else f"{flag(name)[2:]} = {check.metavar}"
    )  # fmt: skip
    return f"{valid} ({kind}; each setting takes one value, e.g. {example})"
