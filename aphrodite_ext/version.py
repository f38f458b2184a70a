"""The base version; builds add a local suffix for their backend (+cpu, +cu130, +rocm63)."""

BASE_VERSION = "0.1.0"
