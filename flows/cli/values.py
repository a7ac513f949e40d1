"""The values of a config as `ballast run` and `ballast status` both resolve them: the
preset or YAML file, `--set` overrides, then MLflow's own conventions for tracking
(flows/conventions.py, which deployment runs apply too).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from flows.conventions import apply_tracking_conventions
from flows.overrides import apply_override


def resolved_values(
    config: str, work_dir: str, overrides: Sequence[str], environ: Mapping[str, str] = os.environ
) -> tuple[dict[str, Any], list[str]]:
    """The config's values with `overrides` and the tracking conventions applied, and one
    line per tracking section saying where its URI and experiment came from."""
    from flows.presets import PRESETS_DIR, load_preset, preset_location

    values = load_preset(config, work_dir)
    for assignment in overrides:
        apply_override(values, assignment)
    shipped = preset_location(config).startswith(str(PRESETS_DIR))
    overridden = {assignment.partition("=")[0] for assignment in overrides}
    return values, apply_tracking_conventions(values, shipped, overridden, environ)
