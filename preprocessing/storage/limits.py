"""Part sizes of multipart uploads: plain constants, so configs and the pure plan can name
them without importing a filesystem."""

DEFAULT_PART_BYTES = 64 << 20
MIN_PART_BYTES = 5 << 20  # S3's smallest part (all but the last)
