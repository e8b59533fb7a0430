"""An OpenAI-compatible gateway: existing agent programs trained without changes (docs/gateway.md).

``model`` in a request names a role; the gateway turns the request into that
role's turn through the same router and model groups as native workflows.
Modules: ``protocol`` (wire format), ``sessions`` (episodes and serving),
``app`` (routes), ``server`` (uvicorn thread), ``agent`` (the ``agent``
workflow kind), ``serve`` (``unimas serve``), ``rewards`` (``agent_reward``).

May import: algorithms, config, contract, controller, errors, groups, output, runtime, trajectory.
"""
