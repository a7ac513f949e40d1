"""When Lightning hands a step's on-step metrics to its loggers: every `log_every_n_steps`
optimizer steps and at a stop. A `LightningModule.log` call on any other step costs the
same (its result collection moved and checked) and reaches no logger: five a step were a
third of a small MLP's profiled step (benchmarks/RESULTS.md, M45)."""

from __future__ import annotations

from typing import Any


def logs_this_step(trainer: Any | None) -> bool:
    """Whether the step under way is one whose on-step metrics reach the loggers.

    Lightning says so only through its logger connector, which is not public API; a
    Lightning without it, or no trainer at all, logs every step, as before."""
    connector = getattr(trainer, "_logger_connector", None)
    return bool(getattr(connector, "should_update_logs", True))
