"""`ballast status`: the newest dataset versions under a config's output root, the lineage
of the current one (a chain of incremental versions: version, parent, rows added, when),
any unfinished reshard attempt (its progress, and the command that resumes a dead one),
and the current champion model in MLflow."""

from __future__ import annotations

from typing import Any

from fsspec.core import url_to_fs

from flows.cli.values import resolved_values
from preprocessing.contract.manifest import (
    ManifestError,
    read_current_version,
    read_manifest,
    version_dir,
)
from preprocessing.driver.resume import unfinished_attempts
from tracking.config import TrackingConfig
from tracking.lifecycle.champion import champion
from tracking.server import TrackingUnavailable


def dataset_versions(root: str, limit: int = 5) -> list[dict[str, Any]]:
    """Committed versions under `root`, newest first (uncommitted directories are skipped)."""
    fs, path = url_to_fs(root)
    found = []
    for directory in fs.glob(f"{path.rstrip('/')}/v-*") if fs.exists(path) else []:
        try:
            manifest, _ = read_manifest(fs.unstrip_protocol(directory))
        except ManifestError:
            continue
        found.append(
            {
                "version": manifest.version_id,
                "created": manifest.created_at,
                "train rows": manifest.split("train").num_rows,
                "parent": manifest.parent_version,
            }
        )
    return sorted(found, key=lambda v: str(v["created"]), reverse=True)[:limit]


def lineage_lines(root: str, version_id: str) -> list[str]:
    """One line per version of the chain that ends at `version_id`, oldest first."""
    manifest, _ = read_manifest(version_dir(root, version_id))
    return [
        f"  {delta.version_id}  parent {delta.parent_version or '-':16}  "
        f"+{delta.added_rows()} training rows from {delta.num_files} files  "
        f"{delta.created_at}"
        for delta in manifest.lineage()
    ]


def describe_champion(tracking_uri: str, name: str) -> str:
    """One line on the current champion of `name` (or why it cannot be told)."""
    try:
        found = champion(tracking_uri, name)
    except TrackingUnavailable as error:
        return f"{name}: unknown ({error})"
    if found is None:
        return f"{name}: no champion yet"
    score = "?" if found["score"] is None else found["score"]
    return f"{name} v{found['version']} (macro-F1 {score}, run {found['run_id']})"


def attempt_lines(root: str, resume_command: str) -> list[str]:
    """One line per unfinished reshard attempt under `root`: running or dead, its last
    heartbeat, what it has written of what it must, and for a dead one the command whose
    rerun resumes it (keeping what it wrote: preprocessing/driver/resume.py)."""
    attempts = unfinished_attempts(root)
    lines = [f"unfinished reshard attempts under {root}:"] if attempts else []
    for attempt in attempts:
        beat = attempt.heartbeat_age_s
        state = ("running" if attempt.running else "dead") + (
            f", last heartbeat {beat:.0f} s ago" if beat is not None else ""
        )
        progress = " and ".join(
            f"{attempt.written[kind]} of {attempt.totals.get(kind, '?')} {kind.replace('_', ' ')}"
            for kind in ("map_outputs", "shards")
        )
        lines.append(
            f"  version {attempt.version_id} ({state}): {progress} written"
            + ("" if attempt.running else f"; resume: {resume_command}")
        )
    return lines


def describe_status(config: str, work_dir: str, overrides: tuple[str, ...] | list[str] = ()) -> str:
    """Text for a person: versions (the current one marked) and the champion, from the
    config as `ballast run` resolves it (presets, `--set`, MLflow's environment variables,
    the fields' defaults)."""
    values, _ = resolved_values(config, work_dir, overrides)
    lines = []
    root = values.get("reshard", {}).get("output_root")
    if root:
        current = read_current_version(root)
        lines.append(f"dataset versions under {root}:")
        lines += [
            f"  {'*' if v['version'] == current else ' '} {v['version']}  {v['created']}"
            f"  {v['train rows']} training rows"
            + (f"  (appends to {v['parent']})" if v["parent"] else "")
            for v in dataset_versions(root)
        ]
        if current:
            lines += [f"lineage of {current}:", *lineage_lines(root, current)]
        flow = "pipeline" if "train" in values else "reshard"
        rest = "".join(f" --set {item}" for item in overrides)
        rest += f" --work-dir {work_dir}" if work_dir != "." else ""
        lines += attempt_lines(root, f"ballast run {flow} --config {config}{rest}")
    section = values.get("train", {}).get("tracking") or values.get("tracking")
    tracking = TrackingConfig.model_validate(section) if section else None
    if tracking and tracking.registered_model_name:
        name = tracking.registered_model_name
        lines.append(f"champion: {describe_champion(tracking.tracking_uri, name)}")
    return "\n".join(lines) or f"{config}: nothing to report (no output_root or tracking)"
