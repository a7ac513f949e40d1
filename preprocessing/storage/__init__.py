"""Reading raw files and writing objects: sources, atomic writes, multipart, locks, sha256."""
