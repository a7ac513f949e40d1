"""The row exchange: map and write tasks, and the staged objects between them."""
