"""The hub of the star: runs episodes, gives each its context, micro-batches role turns to model groups.

``specs`` holds the records the hub and the training loop share (an
episode's spec, a fork's replayed prefix).

May import: config, errors, groups, trajectory, workflow.
"""
