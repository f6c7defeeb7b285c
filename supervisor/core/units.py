"""Units the memory arithmetic and the messages share."""

GiB = 1 << 30
MiB = 1 << 20
