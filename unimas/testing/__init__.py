"""Test models: tiny chat checkpoints built from scratch, for tests, examples and benchmarks without downloads.

``python -m unimas.testing.tiny_chat DIR`` writes one.

May import: nothing in unimas.
"""
