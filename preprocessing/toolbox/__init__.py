"""What every package of ballast uses, below every room: the error taxonomy and retry policy
(faults), credential redaction (secrets), and bounded YAML config loading (config_files).
It imports no other part of ballast."""
