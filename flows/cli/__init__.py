"""The `ballast` command line and its console text: parsing, the commands that are not
flows (init, inspect, status, rollback), the summary a person reads, log files."""
