"""Benchmarks for clusterjob: Prolog and CLI latency, Slurm load, site config scale, submission.

Run ``python -m benchmarks`` (see benchmarks/README.md). Every figure is a ratio against a
reference measured in the same run, so results from a busy shared machine still compare.
"""
