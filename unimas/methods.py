"""What an algorithm plugin imports: the four algorithm protocols and the types and helpers they hand around.

A rollout control, replay buffer, update order or credit shaper (the hooks
``unimas_rollout_controls``, ``unimas_replay_buffers``, ``unimas_update_orders``
and ``unimas_credit_shapers``; docs/algorithms.md) is written against these
names, the way a workflow is written against ``unimas``: ``from unimas.methods
import RolloutSession, by_task``. The built-in methods in
``plugins/unimas_plugins/methods/`` import nothing else from unimas, and
``tests/test_public_surface.py`` holds every plugin to the same rule.

The algorithm hooks are typed but newer than the other eight: this namespace
is experimental (docs/plugins.md, "What is stable"); a change to it is
announced there.

Like ``unimas`` itself, it imports what a name needs on first use (PEP 562),
so ``from unimas.methods import CreditShaper`` at the top of a plugin module
costs nothing at discovery time.
"""

from typing import TYPE_CHECKING

from unimas.lazy_names import lazy_names

if TYPE_CHECKING:  # what the lazy names are, for type checkers and editors
    from unimas.algorithms.credit import CreditedTurn
    from unimas.algorithms.losses import agg_loss
    from unimas.contract.protocols import CreditShaper, ReplayBuffer, RolloutControl, RolloutSession, UpdateOrder
    from unimas.controller.forking import surprisal
    from unimas.controller.specs import EpisodeSpec
    from unimas.training.replay import replayed_copy
    from unimas.training.session import by_task, episode_return

_LAZY = {
    "RolloutControl": "unimas.contract.protocols",
    "ReplayBuffer": "unimas.contract.protocols",
    "UpdateOrder": "unimas.contract.protocols",
    "CreditShaper": "unimas.contract.protocols",
    "RolloutSession": "unimas.contract.protocols",
    "EpisodeSpec": "unimas.controller.specs",
    "CreditedTurn": "unimas.algorithms.credit",
    "replayed_copy": "unimas.training.replay",
    "episode_return": "unimas.training.session",
    "by_task": "unimas.training.session",
    "surprisal": "unimas.controller.forking",
    "agg_loss": "unimas.algorithms.losses",
}
"""Public name -> the module that defines it, imported when the name is first read."""


__getattr__, __dir__ = lazy_names(__name__, _LAZY, globals())

__all__ = [
    "RolloutControl",
    "ReplayBuffer",
    "UpdateOrder",
    "CreditShaper",
    "RolloutSession",
    "EpisodeSpec",
    "CreditedTurn",
    "replayed_copy",
    "episode_return",
    "by_task",
    "surprisal",
    "agg_loss",
]
