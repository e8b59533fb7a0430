"""The training loop and its algorithm plugins: one step is rollout, credit, update; snapshots and resume.

``trainer`` drives the steps; ``resume`` writes a run's checkpoints and
restores the run from them; ``experiment`` resolves the config into
plugin objects; ``rollout``, ``session``, ``replay`` and ``update_order``
are the algorithm-plugin points (docs/algorithms.md); ``pipeline`` overlaps
rollout with updates; ``snapshots`` keeps reference and rollback weights;
``central_critic`` feeds a shared critic group. Estimators, losses and
credit assignment are :mod:`unimas.algorithms`, shared with the groups.

May import: algorithms, config, contract, controller, errors, gateway, groups, output, runtime, safe_load, trajectory, workflow.
"""
