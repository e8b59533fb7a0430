"""Model-group backends, the spokes of the star: the part that owns weights.

``base`` is the interface every backend implements (and the ``Transport`` the
hub calls it through); ``torch``, ``verl`` and ``openai`` are the backends.
Building groups from plugins and running them in process or as Ray actors
is :mod:`unimas.runtime`.

May import: algorithms, config, errors, process, safe_load.
"""
