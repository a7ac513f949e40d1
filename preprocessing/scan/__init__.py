"""Listing and scanning inputs: footers, class/source counts, feature statistics."""
