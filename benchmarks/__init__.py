"""Benchmarks: speed as printed figures, never asserted. `make bench` prints one table."""
