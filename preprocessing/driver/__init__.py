"""The drivers: the reshard and the file map on a Dask cluster, tasks in waves."""
