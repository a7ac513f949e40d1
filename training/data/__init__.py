"""Reading a dataset version for training: the streaming loader, row-group reads,
read-ahead, the verified shard cache and data-wait metrics."""
