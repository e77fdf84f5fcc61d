"""Benchmarks: `python -m metonymy.bench <name> ...`. Speed is measured here, never in unit tests."""
