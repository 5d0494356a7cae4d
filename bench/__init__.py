"""Benchmarks and the load generator: `make bench` (not part of `make test`)."""
