"""Prefect flows and the `ballast` CLI: the composition root. Imports nothing heavy."""
