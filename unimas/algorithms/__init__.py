"""The RL maths every layer above shares: estimators and policy losses by name, and credit assignment.

``estimators`` and ``losses`` resolve estimator and loss names (plugins first, then verl's
tables, known without importing verl through ``verl_catalog``, which caches them and reads that cache
with ``safe_load``); ``losses`` also holds the one objective every backend optimises; ``credit``
turns rewards into per-turn advantages. It sits below the model groups
because their optimisers call the loss, and below the gateway and the run
output because both clip and name rewards as credit does.

May import: config, errors, safe_load, trajectory.
"""
