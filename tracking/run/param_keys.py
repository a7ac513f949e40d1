"""MLflow param keys from any names: dataset column names reach the run's params
(`dataset.nulls.<column>`), and a column may be named anything Parquet, CSV or JSON allow.

MLflow takes keys of at most 250 characters made of letters, digits, `_`, `-`, `.`, ` `
and `/` (its store checks each one, and a path-like key must be normalised: no `//`, no
leading `/` or `..`); a key outside that set fails the whole batch (`Invalid value
"dataset.nulls.Body Mass (g)" for parameter 'params[47].key'`). `mlflow_keys` maps a set of
keys to valid ones, one to one: a valid key is kept as it is; another becomes a readable
form (every other character `_`, cut to fit) plus `-h` and a digest of the original key.
Keys that differ only in case get the digest too, as a store that compares keys without
case (MySQL's default collation) would take them for one. `mlflow_params` keeps the
original key in the value of every param whose key changed, so nothing is lost.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter

MAX_KEY_CHARS = 250
# ASCII only: MLflow's own check is `\w`, which a server may apply with another locale.
_DISALLOWED = re.compile(r"[^A-Za-z0-9_.\- ]")
_DIGEST_CHARS = (8, 16, 32)


def is_plain_key(key: str) -> bool:
    """Whether MLflow takes `key` as it is (slashes are left out: they have path rules)."""
    return (0 < len(key) <= MAX_KEY_CHARS and not _DISALLOWED.search(key)
            and not key.startswith("."))


def readable_key(key: str, digest_chars: int) -> str:
    """`key` with every character MLflow refuses replaced by `_`, cut so that `-h` and
    `digest_chars` hex digits of the original's sha256 fit in MAX_KEY_CHARS."""
    digest = hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:digest_chars]
    text = _DISALLOWED.sub("_", key)
    text = "_" + text[1:] if text.startswith(".") else text
    return f"{text[:MAX_KEY_CHARS - 2 - digest_chars]}-h{digest}"


def mlflow_keys(keys: list[str]) -> dict[str, str]:
    """Each key's MLflow key: distinct for distinct keys, even ignoring case."""
    folded = Counter(key.casefold() for key in set(keys))
    for digest_chars in _DIGEST_CHARS:
        mapping = {key: key if is_plain_key(key) and folded[key.casefold()] == 1
                   else readable_key(key, digest_chars) for key in keys}
        if len({value.casefold() for value in mapping.values()}) == len(set(keys)):
            return mapping
    raise ValueError(f"no distinct MLflow keys for {sorted(keys)[:5]}...")  # sha256 collision


def mlflow_params(params: dict[str, str], max_value_chars: int) -> dict[str, str]:
    """`params` under MLflow keys; a changed key's value records the original key."""
    keys = mlflow_keys(list(params))
    return {keys[key]: (value if keys[key] == key
                        else json.dumps({"key": key, "value": value}, ensure_ascii=False)
                        )[:max_value_chars]
            for key, value in params.items()}
