"""Tiny models made locally for tests, benchmarks and the demo (nothing comes from a model hub)."""
