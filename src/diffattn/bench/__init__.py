"""Benchmarks shipped with the package, so `diffattn bench ...` and `benchmarks/*.py` run the same code."""
