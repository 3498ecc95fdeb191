"""Benchmarks (issue 5): `python -m bench` rewrites BENCHMARKS.md."""
