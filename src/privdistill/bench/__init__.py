"""Benchmarks: timing of the heavy stages, and (issue 8) the reproduction matrix."""
