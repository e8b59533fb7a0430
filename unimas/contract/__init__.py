"""The plugin contract: the hooks a plugin implements, the protocols its objects follow, the registry.

``hookspecs`` and ``protocols`` are what a plugin author reads; ``registry``
collects every installed plugin's entries by kind. The protocols name the
hub's and the spokes' types (``EpisodeContext``, ``ModelGroup``), so the
contract sits above the controller and the groups, and the algorithm hooks'
protocols name ``CreditedTurn`` (algorithms); the layers below it that look
plugins up by name take any table of the right shape
(:class:`unimas.algorithms.estimators.PluginTable`).

May import: algorithms, controller, errors, groups, trajectory.
"""
