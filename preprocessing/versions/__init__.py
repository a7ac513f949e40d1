"""Versions and incremental chains: a run's leased attempt, flat and incremental manifests."""
