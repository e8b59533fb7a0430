"""Workflows: Python coroutines or declarative graphs, one episode context.

Declarative graphs are data plus an evaluator: they drive a context, they do not import it.

May import: config, errors.
"""
