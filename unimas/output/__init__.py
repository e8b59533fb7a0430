"""What a run writes and reads back: the run directory, checkpoints, metrics, loggers, the console line.

``rundir`` owns the folder (and refuses paths that leave it), ``checkpoints``
the checkpoint manifests, ``metrics`` and ``jsonl`` the metric and
trajectory files, ``loggers`` and ``console`` where step metrics go. The
report (:mod:`unimas.report`) reads these files and is its own package.

May import: algorithms, config, errors, safe_load, trajectory.
"""
