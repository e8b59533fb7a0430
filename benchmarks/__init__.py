"""Benchmarks: one script per question, each prints a markdown table (see docs/performance.md)."""
