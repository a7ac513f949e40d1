"""`ballast rollback --dataset ROOT --to VERSION_ID`: point `_CURRENT` back at a version.

The version must be committed (its manifest reads and checks, as any reader would);
`_CURRENT` then moves by the compare-and-swap of a commit
(preprocessing/contract/commit.py `swap_current`, expecting the version it named a
moment before), so a commit racing the rollback makes one of them fail, never both
half-succeed. Idempotent: a root already at the version is left as it is. Nothing is
deleted: the newer versions stay on disk, and an incremental run after a rollback
appends to the version it now names. The root's Delta Lake table then gets a new table
version holding the version rolled back to (versions/table.py), also when `_CURRENT`
named it already (a rollback cut off before its table commit).
"""

from __future__ import annotations

from preprocessing.contract.commit import swap_current
from preprocessing.contract.manifest import (
    CURRENT_NAME,
    ManifestError,
    manifest_uri,
    read_current_version,
    read_manifest,
)
from preprocessing.versions.table import publish_current


def rollback_dataset(root: str, version_id: str) -> str:
    """Point `root`'s `_CURRENT` at committed version `version_id`; what was done, a line."""
    found = read_current_version(root)
    if found is None:
        raise ManifestError(f"{root}: no {CURRENT_NAME}; is this a ballast dataset root?")
    read_manifest(manifest_uri(root, version_id))  # refuses a version that is not committed
    if found == version_id:
        publish_current(root)
        return f"{root}: _CURRENT already names version {version_id}; nothing to do"
    swap_current(root, version_id, expected=found)
    table_version = publish_current(root)
    published = "" if table_version is None else f" (table version {table_version})"
    return f"{root}: _CURRENT moved from version {found} back to {version_id}{published}"
