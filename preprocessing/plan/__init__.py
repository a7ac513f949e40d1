"""The pure plan (no I/O): counts, keyed permutations, row fates, split and exchange layout."""
