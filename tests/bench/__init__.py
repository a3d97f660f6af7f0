"""Benchmarks, not tests (never collected: their files are not test_*.py): `make bench*` runs them."""
