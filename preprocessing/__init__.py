"""Resharding skewed raw data into a balanced, versioned dataset. Imports nothing heavy."""
