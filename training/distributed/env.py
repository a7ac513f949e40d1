"""This rank's place in the job, as torchrun sets it in the environment: the one reader of
RANK, WORLD_SIZE and LOCAL_WORLD_SIZE. A process started without torchrun is rank 0 of 1.
Also where a job's ranks leave their error and hang logs for the launcher. No torch
import: the launcher and a rank's error report read it before torch loads."""

from __future__ import annotations

import os


def env_rank() -> int:
    """RANK (0 without torchrun)."""
    return int(os.environ.get("RANK", "0"))


def env_world_size() -> int:
    """WORLD_SIZE: the ranks of the whole job (1 without torchrun)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def env_local_world_size() -> int:
    """LOCAL_WORLD_SIZE: the ranks on this node (the whole job without torchrun)."""
    return int(os.environ.get("LOCAL_WORLD_SIZE", str(env_world_size())))


def errors_dir(output_dir: str) -> str:
    """`<output_dir>/errors`: where ranks leave error and hang logs for the launcher."""
    return f"{output_dir.rstrip('/')}/errors"
