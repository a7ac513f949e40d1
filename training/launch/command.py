"""The torchrun command line of every launcher: one builder for all of them.

Ranks start with `--max-restarts 0`: torchrun's in-place restarts recovered a lost
rank in 2 of 5 trials on gloo, a job-level retry resuming from the last checkpoint
in 4 of 4 (docs/architecture.md M7), so a failed attempt ends and the retry policy
relaunches the whole job (training/launch/job.py).
"""

from __future__ import annotations

from training.launch.config import JobBase, NodesJob


def torchrun_command(
    spec: JobBase,
    config_uri: str,
    resume: bool,
    python: str,
    rdzv_endpoint: str | None = None,
) -> list[str]:
    """`python -m torch.distributed.run ... -m training --config URI [--resume]`:
    standalone on one node when `rdzv_endpoint` is None, else the node's share of
    `spec.num_nodes` meeting at the c10d endpoint (node ranks assigned there)."""
    command = [python, "-m", "torch.distributed.run"]
    if rdzv_endpoint is None or not isinstance(spec, NodesJob):
        command.append("--standalone")
    else:
        command += [
            "--nnodes",
            str(spec.num_nodes),
            "--rdzv-backend",
            "c10d",
            "--rdzv-id",
            spec.job_name,
            "--rdzv-endpoint",
            rdzv_endpoint,
        ]
    command += ["--nproc-per-node", str(spec.num_processes_per_node), "--max-restarts", "0"]
    return [*command, "-m", "training", "--config", config_uri, *(["--resume"] if resume else [])]
