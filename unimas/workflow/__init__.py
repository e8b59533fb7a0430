"""Workflows: Python coroutines or declarative graphs, one episode context."""
