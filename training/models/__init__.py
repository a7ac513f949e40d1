"""Models: the built-in classifier and token transformer (no parallelism inside: see
training.distributed) and the token dataset generator."""
