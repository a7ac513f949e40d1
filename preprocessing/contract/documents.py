"""JSON of the version contract's documents (the manifest), laid out for people and written
at the speed of the C encoder.

`document_json(record)` turns a dataclass tree into JSON with its keys sorted: each key of a
mapping on a line of its own, and each item of a list of records (a split's shards, the
inputs, the lineage) on one line, so that a manifest of 2,000 shards reads one shard per
line and `grep` finds one. Python's `json.dumps` with `indent` runs its pure-Python encoder;
with `dataclasses.asdict` first, it cost 0.33 s of the driver's commit for 5,000 inputs and
2,000 shards (benchmarks/RESULTS.md M37). Every item here goes through the C encoder.

`read_document(text)` is `json.loads(text)`, value for value and error for error, at
orjson's speed where orjson gives the same answer: a wide manifest (2.5 MB, 5,000 column
specs) parses in about half the CPU (benchmarks/RESULTS.md M94). orjson refuses what the
standard library reads (NaN, Infinity, 1e400, a lone surrogate, nesting past 1,024) and
reads an integer beyond 64 bits as a float where `json.loads` keeps it exact: a refusal,
or a text that may hold such an integer (a run of 19 digits not after `.`, `e` or `+`),
goes to `json.loads`, so nothing changes type and every error is the standard one.
"""

from __future__ import annotations

import json
from dataclasses import fields, is_dataclass
from typing import Any

import orjson

_ENCODE = json.JSONEncoder(sort_keys=True, default=str, separators=(", ", ": ")).encode
_FIELD_NAMES: dict[type, tuple[str, ...]] = {}
# Every byte of a document mapped to what an integer's digits can be told by: a digit to
# `0`, what makes digits a fraction or an exponent (`.eE+`) to `.`, any other byte (`-`,
# a space, `[`, `,`, `:`) to a space. A literal orjson would read as a float where
# `json.loads` keeps an int (19 digits or more) then reads as a space and 19 zeros.
_DIGIT_RUNS = bytes(
    ord("0") if byte in b"0123456789" else ord(".") if byte in b".eE+" else ord(" ")
    for byte in range(256)
)
_LONG_INTEGER = b" " + b"0" * 19


def read_document(text: str | bytes) -> Any:
    """`json.loads(text)`: the same values of the same types, the same errors (see the
    module); orjson parses it where that holds."""
    data = text.encode(errors="surrogatepass") if isinstance(text, str) else text
    if _LONG_INTEGER not in b" " + data.translate(_DIGIT_RUNS):
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            pass  # json.loads reads it, or says why not, in its own words
    return json.loads(text)


def document_json(record: Any) -> str:
    """`record` (a dataclass, with dataclasses, lists and mappings inside) as JSON."""
    return _laid_out(plain(record), "")


def plain(value: Any) -> Any:
    """`dataclasses.asdict` without its deep copies: the values are encoded right away."""
    if isinstance(value, str | int | float) or value is None:
        return value
    if isinstance(value, dict):
        return {key: plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [plain(item) for item in value]
    names = _field_names(type(value))
    return {name: plain(getattr(value, name)) for name in names} if names else value


def _field_names(kind: type) -> tuple[str, ...]:
    """A dataclass's field names (none for any other type), looked up once per class."""
    if kind not in _FIELD_NAMES:
        _FIELD_NAMES[kind] = tuple(item.name for item in fields(kind)) if is_dataclass(kind) else ()
    return _FIELD_NAMES[kind]


def _laid_out(value: Any, indent: str) -> str:
    """A mapping of string keys a key per line; a list of mappings an item per line; any
    other value (and each such item) on one line."""
    inner = indent + " "
    if isinstance(value, dict) and value and all(isinstance(key, str) for key in value):
        lines = [f"{inner}{_ENCODE(key)}: {_laid_out(value[key], inner)}" for key in sorted(value)]
        return "{\n" + ",\n".join(lines) + "\n" + indent + "}"
    if isinstance(value, list) and value and all(isinstance(item, dict) for item in value):
        return "[\n" + ",\n".join(inner + _ENCODE(item) for item in value) + "\n" + indent + "]"
    return _ENCODE(value)
