"""Distributed strategy: Lightning strategies, measured DDP communication, FSDP2 / tensor
parallelization and distributed checkpoints."""
