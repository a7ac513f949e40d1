"""Credentials inside values: redact them in text, and lift them out of URIs.

    redact("http://ada:hunter2@mlflow:5000/api?token=abc")
    # -> "http://ada:***@mlflow:5000/api?token=***"
    redact_value({"env": {"API_TOKEN": "abc"}, "uri": "http://ada:hunter2@mlflow"})
    # -> {"env": {"API_TOKEN": "***"}, "uri": "http://ada:***@mlflow"}
    split_credentials("http://ada:hunter2@mlflow:5000")
    # -> ("http://mlflow:5000", "ada", "hunter2")

Every layer may import this module (like `preprocessing/contract/manifest.py`), so it
depends on the standard library only. Whatever ballast writes or prints that may
hold a URI or an option (configs on disk, error tails, logs) goes through
`redact`; a secret the job needs travels in the environment instead.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

REDACTED = "***"
# A name that says it holds a credential (a config key, a query parameter, a header, an
# environment variable), read word by word (`aws_secret_access_key`, `accessToken`,
# `X-Amz-Signature`, `PGPASSWORD`): these words anywhere in it ...
_CREDENTIAL_WORD = re.compile(
    r"secret|password|passwd|passphrase|credential|apikey|accesskey|authorization"
)
# ... or these two words together (`api_key`, `AccessKey`) ...
_CREDENTIAL_PAIR = re.compile(r"(?:^|_)(?:api|access|private)_key(?:_|$)")
# ... or a last word that is the credential itself (`api_token`, `HF_TOKEN`, `sig`): a
# count or a tool named after one is none (`max_tokens`, `tokenizer`, `signature_tokens`).
_CREDENTIAL_LAST = re.compile(r"(?:token|signature|sig)$")
_WORD_BREAK = re.compile(r"[^a-z0-9]+")
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
# scheme://user:password@ -- the password ends at the last "@" before the host part.
_URI_PASSWORD = re.compile(r"(?P<head>\b[A-Za-z][A-Za-z0-9+.-]*://[^\s:/?#@]*):[^\s/?#]*@")
# ?name=value / &name=value where the name looks like a credential.
_QUERY_SECRET = re.compile(r"(?P<head>[?&;](?P<name>[^\s=&#?;]+)=)(?P<value>[^\s&#;]*)")


def redact(text: str) -> str:
    """`text` with URI passwords and credential-named query values replaced by ***."""
    text = _URI_PASSWORD.sub(lambda match: f"{match['head']}:{REDACTED}@", text)
    return _QUERY_SECRET.sub(_redact_query_value, text)


# Settings whose keys are the user's data, not names of settings: `dataset.nulls` (column
# -> null policy), `mix.class_weights` and `mix.source_weights` (label or source ->
# weight). A column called `api_token` names data, and its policy word is no credential:
# redacted by its key, the policy of such a column vanished from MLflow's params, from
# Prefect's parameters and from the version id's payload (two policies, one id).
DATA_KEYED = frozenset({"nulls", "class_weights", "source_weights"})


def redact_value(value: Any, keys_are_data: bool = False, hidden: bool = False) -> Any:
    """A JSON-like value (dicts, lists, strings, numbers) with every string redacted as
    text, and every string or number held under a credential-named key (`API_TOKEN`,
    `password`, anything inside `credentials: {...}`) replaced by ***; flags, None and
    empty strings stay (they hold no secret). The keys of a `DATA_KEYED` map are data,
    never a credential's name. The one rule for what MLflow, Prefect and the manifest show
    (tracking's `flatten` dots this value)."""
    if isinstance(value, dict):
        return {
            key: redact_value(
                item,
                str(key) in DATA_KEYED,
                hidden or (not keys_are_data and names_a_credential(key)),
            )
            for key, item in value.items()
        }
    if isinstance(value, list | tuple):
        return [redact_value(item, hidden=hidden) for item in value]
    if hidden and value != "" and isinstance(value, str | int | float):
        return value if isinstance(value, bool) else REDACTED
    return redact(value) if isinstance(value, str) else value


def names_a_credential(key: Any) -> bool:
    """Whether a setting's name says it holds a credential (the one rule for config keys,
    query parameters and environment variables)."""
    words = _WORD_BREAK.sub("_", _CAMEL.sub("_", str(key)).lower()).strip("_")
    return bool(
        _CREDENTIAL_WORD.search(words)
        or _CREDENTIAL_PAIR.search(words)
        or _CREDENTIAL_LAST.search(words)
    )


def _redact_query_value(match: re.Match[str]) -> str:
    if names_a_credential(match["name"]) and match["value"]:
        return f"{match['head']}{REDACTED}"
    return match[0]


def split_credentials(uri: str) -> tuple[str, str | None, str | None]:
    """(the URI without user and password, the user, the password), both decoded from
    %-escapes; a URI without a password comes back unchanged, with (None, None)."""
    parts = urlsplit(uri)
    if not parts.scheme or parts.password is None:
        return uri, None, None
    host = parts.hostname or ""
    netloc = f"[{host}]" if ":" in host else host
    netloc += f":{parts.port}" if parts.port is not None else ""
    user = unquote(parts.username) if parts.username else None
    return urlunsplit(parts._replace(netloc=netloc)), user, unquote(parts.password)
