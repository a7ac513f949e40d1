"""Reading a YAML config file: its mapping, or one error naming the file.

Shared by every config loader (preprocessing/config.py, training/config.py): a file that
is not YAML (cut short, flipped bytes, not text, nested past what the parser takes) or
whose top level is not a mapping raises `ConfigFileError` naming the file and what is
wrong. A file over MAX_BYTES or with brackets nested past MAX_DEPTH is refused before
parsing: PyYAML's scanner takes seconds to minutes on 1e5 nested brackets (found by the
fuzz tests, tests/test_fuzz_readers.py), and no config needs either. The mapping's
fields are then validated by the loader's pydantic model, whose errors name the field.
"""

from __future__ import annotations

from typing import Any

import yaml

MAX_BYTES = 1 << 20
MAX_DEPTH = 100


class ConfigFileError(ValueError):
    """A config file that cannot be read as a YAML mapping."""


def parse_yaml_mapping(text: str | bytes, origin: str) -> dict[str, Any]:
    """The top-level mapping of a YAML document (an empty document: {})."""
    if problem := _size_problem(text.encode() if isinstance(text, str) else text):
        raise ConfigFileError(f"{origin}: {problem}")
    try:
        value = yaml.safe_load(text)
    except (yaml.YAMLError, UnicodeDecodeError, RecursionError, ValueError) as error:
        problem = "nested too deeply" if isinstance(error, RecursionError) else str(error)
        raise ConfigFileError(f"{origin}: not a readable YAML file ({problem})") from None
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigFileError(f"{origin}: the top level is a {type(value).__name__}, "
                              f"expected a mapping of settings")
    return value


def _size_problem(data: bytes) -> str:
    """Why `data` is too big or too deeply nested to parse, or "" (brackets inside quoted
    strings count too: a bound, not a parse)."""
    if len(data) > MAX_BYTES:
        return f"{len(data)} bytes, more than a config file may hold ({MAX_BYTES})"
    depth = deepest = 0
    for byte in data.translate(None, _NOT_BRACKETS):
        depth = max(depth + (1 if byte in b"[{" else -1), 0)
        deepest = max(deepest, depth)
    if deepest > MAX_DEPTH:
        return f"brackets nested {deepest} deep, more than {MAX_DEPTH}"
    return ""


_NOT_BRACKETS = bytes(set(range(256)) - set(b"[]{}"))
