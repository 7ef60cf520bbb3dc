"""Where a run's settings come from: defaults, then a TOML file, then flags.

    cfg = config_from("run.toml", {"echo_factor": "auto"})   # the file, then overrides

Each value is checked by its option's own check (:func:`dataecho.app.config.options`), so an
error names the flag or the file key it came from, the value seen and the valid range.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from dataecho.app.config import (
    CLI_TARGETS,
    LOADER_KEYS,
    ConfigError,
    TrainConfig,
    did_you_mean,
    flag,
    options,
)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover (pyproject pulls tomli in for 3.10)
    import tomli as tomllib


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
    for key, value, valid in _toml_entries(raw, names):
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
        else:
            yield key, value, names


def config_from(
    toml_path: str | Path | None = None,
    overrides: Mapping[str, Any] | None = None,
    *,
    defaults: Mapping[str, Any] | None = None,
    cli_targets: bool = False,
) -> TrainConfig:
    """A config from ``defaults``, then a TOML file, then ``overrides`` (flags; text is parsed).

    Each value is checked on its own first, so an error names the flag or the file key it came
    from. ``cli_targets``: a workload whose target is given nowhere gets :data:`CLI_TARGETS`'.
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
    for name, (value, origin) in given.items():
        check = checks[name]
        try:
            values[name] = check.check(
                name, check.parse(value) if isinstance(value, str) else value
            )
        except (TypeError, ValueError) as err:
            raise ConfigError(f"{origin}: {err}") from None
    if cli_targets:
        key, target = CLI_TARGETS.get(values.get("workload", "cnn"), (None, None))
        if key is not None and key not in given:
            values[key] = target
    try:
        return TrainConfig(**values)
    except (TypeError, ValueError) as err:
        raise ConfigError(str(err)) from None
