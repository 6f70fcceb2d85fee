"""Benchmarks: timing of the heavy stages, and the reproduction matrix (docs/results.md)."""
