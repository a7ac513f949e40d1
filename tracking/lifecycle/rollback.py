"""`ballast rollback --model NAME [--to VERSION]`: move the `champion` alias back.

By default to the version the current champion replaced (`ballast.previous_champion`,
recorded when it was promoted: tracking/lifecycle/promotion.py). Why is recorded as tags: on the
version rolled back from (`ballast.rolled_back`) and on the registered model
(`ballast.last_rollback`: from, to, reason). Idempotent: a second call finds the
champion already where the last rollback put it and changes nothing. A model, version
or previous champion that does not exist is refused with the reason.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from tracking.lifecycle.champion import champion
from tracking.lifecycle.promotion import PREVIOUS_CHAMPION_TAG

ROLLED_BACK_TAG = "ballast.rolled_back"
LAST_ROLLBACK_TAG = "ballast.last_rollback"


class RollbackRefused(ValueError):
    """A rollback to something that does not exist, or with nothing to roll back to."""


def _last_rollback(client: MlflowClient, name: str) -> dict[str, str] | None:
    try:
        tags = client.get_registered_model(name).tags
    except MlflowException as error:
        raise RollbackRefused(f"registered model {name!r} does not exist") from error
    raw = tags.get(LAST_ROLLBACK_TAG)
    return json.loads(raw) if raw else None


def _target(client: MlflowClient, name: str, current: int, to: int | None) -> int:
    if to is not None:
        try:
            client.get_model_version(name, str(to))
        except MlflowException as error:
            raise RollbackRefused(f"model {name!r} has no version {to}") from error
        return to
    previous = client.get_model_version(name, str(current)).tags.get(PREVIOUS_CHAMPION_TAG)
    if previous is None:
        raise RollbackRefused(
            f"champion v{current} of {name!r} replaced no earlier champion "
            "(no ballast.previous_champion tag); give --to VERSION"
        )
    return int(previous)


def rollback_model(
    tracking_uri: str, name: str, to: int | None = None, reason: str = "ballast rollback"
) -> str:
    """Move `champion` of `name` back (see the module docstring); what was done, a line."""
    client = MlflowClient(tracking_uri)
    last = _last_rollback(client, name)
    current = champion(tracking_uri, name)
    if current is None:
        raise RollbackRefused(f"model {name!r} has no champion to roll back")
    if to is None and last is not None and int(last["to"]) == current["version"]:
        return (
            f"{name}: champion is already v{current['version']} (rolled back from "
            f"v{last['from']}: {last['reason']}); nothing to do"
        )
    target = _target(client, name, current["version"], to)
    if target == current["version"]:
        return f"{name}: champion is already v{target}; nothing to do"
    client.set_registered_model_alias(name, "champion", str(target))
    at = datetime.now(UTC).isoformat("T", "seconds")
    client.set_model_version_tag(
        name,
        str(current["version"]),
        ROLLED_BACK_TAG,
        f"{at}: champion moved back to v{target}: {reason}",
    )
    client.set_registered_model_tag(
        name,
        LAST_ROLLBACK_TAG,
        json.dumps({"from": current["version"], "to": target, "reason": reason, "at": at}),
    )
    return f"{name}: champion moved from v{current['version']} back to v{target} ({reason})"
