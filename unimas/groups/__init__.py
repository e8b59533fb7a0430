"""Model-group backends, the spokes of the star: the part that owns weights.

``base`` is the interface every backend implements (and the ``Transport`` the
hub calls it through); ``torch``, ``verl`` and ``openai`` are the backends.
Beside ``base``, the backend-neutral kit the backends share, so that a role
behaves the same on each: prompt checks and fitting (``prompts``), results
(``results``), the critic's statistics and GAE (``critic_common``,
``role_gae``), LoRA target checks (``lora``), and Hugging Face loading,
chat rendering and KV-cache sampling (``hf``). ``torch`` and ``verl`` are
layers of their own in docs/architecture.md: each may import this package,
neither may import the other. Building groups from plugins and running them
in process or as Ray actors is :mod:`unimas.runtime`.

May import: algorithms, config, errors, process, safe_load.
"""
