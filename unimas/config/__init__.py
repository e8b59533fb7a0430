"""The experiment config: the typed schema, loading a YAML file with ``--set`` overrides, plugin parameters.

``schema`` is one pydantic model per YAML section (the ``workflow.agent`` and
algorithm-plugin entries included), each built on ``strict``'s checks of
keys, numbers and path-safe names; ``loading`` reads a file, applies
``--set`` and formats validation errors; ``plugin_params`` checks a config
entry's ``params`` against the keyword arguments of the function it names.
Everything above reads the config, so it sits at the bottom: it knows no
model, plugin or run. Checks that need those (validation, the dry run, the
generated reference) are :mod:`unimas.preflight`.

May import: errors.
"""
