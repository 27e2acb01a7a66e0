"""The spdld benchmark harness: see ../README.md."""
