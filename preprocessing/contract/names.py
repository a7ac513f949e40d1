"""The one rule by which a user's value becomes a key or a name in another system.

Label, source and category values and column names can be any text a Parquet, CSV or JSON
file holds: `Adelie Penguin (Pygoscelis adeliae)`, `a/b`, an empty string, a newline,
`Mass` beside `mass`. Where such a value becomes part of a key, it goes through this
module, one function per boundary:

- `mlflow_key`: an MLflow metric, param or tag key (`val_recall/<label>`,
  `drift.feature.<column>.psi`, `dataset.nulls.<column>`); `mlflow_params` applies it to a
  run's params and keeps each renamed key's original in the param's value.
- `yaml_comment`: a value printed in a YAML comment (`ballast init`'s column table), where
  a line break would end the comment and turn the rest of the value into YAML.
- `yaml_text`: a document holding values as keys and values (`ballast init`'s config):
  PyYAML writes some characters (NEL, `\x85`) raw that it then reads as a line break.

The rule is stable (a value's key depends on that value alone, so a class keeps its metric
key from run to run) and one to one even ignoring case (a store that compares keys without
case, as MySQL's default collation does, must not merge `Mass` and `mass`). A value is kept
as it is when it is plain: lowercase ASCII letters, digits, `_`, `-`, `.` and spaces, not
starting with `.` or a space, and not ending the way a mapped key ends. Any other value becomes a
readable slug (each refused character `_`, cut to fit) plus `-h` and 16 hex digits of the
sha256 of the value: two distinct values share a key only if their digests collide.
The original is kept where a person reads it: the run's summary (`val_recall` by label),
the Prefect tables and the drift report.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

import yaml

MAX_MLFLOW_KEY_CHARS = 250  # MLflow's limit on metric, param and tag keys
DIGEST_CHARS = 16
# ASCII only: MLflow checks `\w`, which a server may apply under another locale; no `:`
# (a file store path on Windows) and no `/` in a value (it would add a path level).
_PLAIN = re.compile(r"[a-z0-9_\-][a-z0-9_. \-]*")
_REFUSED = re.compile(r"[^A-Za-z0-9_. \-]")
_MAPPED_END = re.compile(rf"-h[0-9a-f]{{{DIGEST_CHARS}}}")


def is_plain(value: str, max_chars: int) -> bool:
    """Whether `value` is kept as it is in a key (see the module docstring)."""
    return (
        0 < len(value) <= max_chars
        and _PLAIN.fullmatch(value) is not None
        and _MAPPED_END.fullmatch(value[-DIGEST_CHARS - 2 :]) is None
    )


def digest(value: str) -> str:
    """DIGEST_CHARS hex digits of the value's sha256 (surrogates too: any Python str)."""
    return hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()[:DIGEST_CHARS]


def mlflow_key(value: object, prefix: str = "", suffix: str = "") -> str:
    """`value` as a key MLflow takes, between the code's own `prefix` and `suffix`
    (`val_recall/`, `drift.feature.` and `.psi`): a plain value as it is, any other as
    `<slug>-h<digest>` (see the module docstring)."""
    text, room = str(value), MAX_MLFLOW_KEY_CHARS - len(prefix) - len(suffix)
    if room < DIGEST_CHARS + 3 or _REFUSED.search((prefix + suffix).replace("/", "")):
        raise ValueError(f"MLflow key around {prefix!r} and {suffix!r}: not plain or too long")
    if is_plain(text, room):
        return f"{prefix}{text}{suffix}"
    slug = _REFUSED.sub("_", text)
    slug = "_" + slug[1:] if slug[:1] in (".", " ") else slug
    return f"{prefix}{slug[: room - DIGEST_CHARS - 2]}-h{digest(text)}{suffix}"


def mlflow_params(params: dict[str, str], max_value_chars: int) -> dict[str, str]:
    """`params` under `mlflow_key` keys; a renamed key's value records the original key
    (`{"key": ..., "value": ...}`), so nothing is lost."""
    mapped = {}
    for key, value in params.items():
        new_key = mlflow_key(key)
        if new_key != key:
            value = json.dumps({"key": key, "value": value}, ensure_ascii=False)
        mapped[new_key] = value[:max_value_chars]
    return mapped


def yaml_comment(value: object) -> str:
    """`value` as text on one line of a YAML comment: each line break or other character
    that is not printable is written as its Python escape (`\\n`, `\\u2028`)."""
    text = str(value)
    return "".join(char if char.isprintable() else repr(char)[1:-1] for char in text)


def yaml_text(document: Any) -> str:
    """`document` as YAML that reads back equal: non-ASCII letters as they are where PyYAML
    reads them back so, else every non-ASCII character escaped (`"\\N"` for NEL)."""
    options: dict[str, Any] = {"sort_keys": False, "width": 1 << 16}
    text = yaml.safe_dump(document, allow_unicode=True, **options)
    if yaml.safe_load(text) == document:
        return text
    return yaml.safe_dump(document, allow_unicode=False, **options)
