"""Credentials inside values: what `redact` hides and keeps, and how `split_credentials`
moves a password out of a URI."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from preprocessing.toolbox.secrets import (
    names_a_credential,
    redact,
    redact_value,
    split_credentials,
)

# Names a user's columns, labels and sources may have, some of them a credential's name.
hostile_names = st.one_of(
    st.sampled_from(["SECRET", "api_token", "Password (old)", "access_key", "x"]),
    st.text(max_size=40),
)


def test_redact_hides_uri_passwords_and_credential_query_values_only() -> None:
    """Invariant: a password in a URI's user part and the value of a query parameter whose
    name says credential become ***; the user, host, path and other parameters stay, and
    text without credentials comes back unchanged."""
    text = (
        "MlflowException: http://ada:p%40ss:w0rd@mlflow.internal:5000/api/2.0 failed; "
        "s3://bucket/key?X-Amz-Signature=abc123&X-Amz-Date=20260101 and "
        "https://host/x?token=t0k&page=2"
    )
    assert redact(text) == (
        "MlflowException: http://ada:***@mlflow.internal:5000/api/2.0 failed; "
        "s3://bucket/key?X-Amz-Signature=***&X-Amz-Date=20260101 and "
        "https://host/x?token=***&page=2"
    )
    plain = "sqlite:///tmp/mlflow.db http://host:5000/path@v2 s3://b/k ratio 1:2@3"
    assert redact(plain) == plain


def test_split_credentials_gives_a_uri_without_them() -> None:
    """Invariant: the URI loses user and password and keeps scheme, host, port, path and
    query; both come back %-decoded; a URI without a password is returned as it is."""
    uri, user, password = split_credentials("https://ada%40corp:p%40ss@[::1]:5000/ml?x=1")
    assert (uri, user, password) == ("https://[::1]:5000/ml?x=1", "ada@corp", "p@ss")
    for same in ("sqlite:///tmp/mlflow.db", "http://ada@host:5000", "/local/path"):
        assert split_credentials(same) == (same, None, None)


def test_redact_value_hides_credential_strings_at_any_depth() -> None:
    """Invariant: in nested dicts and lists, a string under a credential-named key becomes
    *** and every other string is redacted as text; numbers, flags, None and keys stay."""
    value = {
        "tracking": {"tracking_uri": "http://ada:hunter2@mlflow:5000", "run_id": None},
        "dask": {"options": {"env": {"API_TOKEN": "t0k", "HOME": "/home/ada"}}},
        "inputs": ["s3://b/raw", "https://host/x?access_token=t0k&page=2"],
        "loader": {"max_tokens": 128, "secret_sauce": True, "password": ""},
        "db": {"password": 1234, "credentials": {"user": "ada", "port": 5432}},
    }
    assert redact_value(value) == {
        "tracking": {"tracking_uri": "http://ada:***@mlflow:5000", "run_id": None},
        "dask": {"options": {"env": {"API_TOKEN": "***", "HOME": "/home/ada"}}},
        "inputs": ["s3://b/raw", "https://host/x?access_token=***&page=2"],
        "loader": {"max_tokens": 128, "secret_sauce": True, "password": ""},
        "db": {"password": "***", "credentials": {"user": "***", "port": "***"}},
    }


CREDENTIAL_NAMES = [
    "password", "PGPASSWORD", "api_token", "HF_TOKEN", "accessToken", "AWS_SESSION_TOKEN",
    "aws_secret_access_key", "client_secret", "X-Amz-Signature", "X-Amz-Credential", "sig",
    "apikey", "api-key", "AccessKey", "private_key", "Authorization", "authtoken",
]  # fmt: skip
# Settings named after tokens or signatures that count or build them, never hold one.
PLAIN_NAMES = [
    "max_tokens", "tokenizer", "signature_tokens", "num_tokens", "token_rows", "balance_by",
    "key_column", "keyword", "monkey", "design", "tokens_per_step", "bucket",
]  # fmt: skip


def test_a_credential_is_named_by_its_words_not_by_a_substring() -> None:
    """Invariant: a name holding a credential's word (secret, password, credential, an
    API or access key) or ending in the credential itself (token, signature) is one, in
    any case or separator; a name that counts or builds tokens or signatures is not (its
    number was shown as *** in MLflow while Prefect showed it)."""
    assert [name for name in CREDENTIAL_NAMES if not names_a_credential(name)] == []
    assert [name for name in PLAIN_NAMES if names_a_credential(name)] == []


@settings(max_examples=100, deadline=None)
@given(columns=st.lists(hostile_names, min_size=1, max_size=4, unique=True))
def test_a_column_or_label_named_like_a_credential_keeps_its_policy_and_weight(
    columns: list[str],
) -> None:
    """Invariant: the keys of `nulls`, `class_weights` and `source_weights` are data (column
    names, labels, sources), never credential names: whatever they are called (`SECRET`,
    `api_token`), their null policy and weight come back as they were, so that two policies
    of one column give two version ids and MLflow and Prefect show the policy; a
    credential-named setting beside them is still hidden."""
    settings_ = {
        "dataset": {"nulls": {name: "fill_mean" for name in columns}},
        "mix": {"class_weights": dict.fromkeys(columns, 2.0), "source_weights": None},
        "storage_options": {"secret": "s3cr3t"},
    }
    redacted = redact_value(settings_)
    assert redacted["dataset"] == settings_["dataset"]
    assert redacted["mix"] == settings_["mix"]
    assert redacted["storage_options"] == {"secret": "***"}
    other = {**settings_, "dataset": {"nulls": dict.fromkeys(columns, "fill_zero")}}
    assert redact_value(other) != redacted
