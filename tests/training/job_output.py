"""What a failed torchrun job printed, cut so that the cause survives a CI log's tail.

torchrun ends a failed job with its own summary (one block per rank, "exitcode: 1",
"To enable traceback see ..."), which fills the last few thousand characters of the
output; the rank's Python traceback, the only line that says why, sits above it and
was cut off in the one CI failure it mattered for. `job_failure` leads with every
rank's traceback, then the output's tail."""

from __future__ import annotations

import re

TRACEBACK = re.compile(r"^.*Traceback \(most recent call last\):$", re.MULTILINE)
TRACE_CHARS, TAIL_CHARS = 3000, 1500


def tracebacks(output: str) -> list[str]:
    """Each Python traceback in `output`, from its header to its last line (the error)."""
    starts = [match.start() for match in TRACEBACK.finditer(output)]
    blocks = []
    for start in starts:
        lines = output[start:].splitlines()
        # A traceback ends at its first unindented line after the header: the exception.
        end = next((i for i, line in enumerate(lines[1:], 1) if not line.startswith(" ")), 0)
        blocks.append("\n".join(lines[: end + 1])[-TRACE_CHARS:])
    return blocks


def job_failure(output: str) -> str:
    """A failed job's tracebacks (deduplicated, in order), then the last of its output."""
    unique = list(dict.fromkeys(tracebacks(output)))
    found = "\n---\n".join(unique) if unique else "(no Python traceback in the output)"
    return f"tracebacks:\n{found}\n--- the output's tail:\n{output[-TAIL_CHARS:]}"
