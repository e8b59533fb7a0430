"""Built-in algorithm methods from recent papers, each a plugin through the public hooks.

| name | hook | follows |
|---|---|---|
| ``hgpo`` | credit shaper | HGPO |
| ``gagpo`` | credit shaper | GAGPO |
| ``counterfactual`` | credit shaper | InfoPO, AT^2PO |
| ``gdpo`` | credit shaper (verl's GDPO) | GDPO (verl) |
| ``entropy_branch`` | rollout control | ARPO, AT^2PO, TRACE |
| ``adaptive_budget`` | rollout control | TRACE, StarPO-S |
| ``verified_successes`` | replay buffer | RePO, RLEP |
| ``reverse_execution`` | update order | SeeUPO |
| ``m2po`` | policy loss | M2PO |
| ``passthrough`` | estimator | (pairs with the credit shapers) |

Each method names the papers it follows (search them by name); docs/algorithms.md has examples.
"""

from __future__ import annotations

import unimas

from .branching import EntropyBranch
from .budget import AdaptiveBudget
from .counterfactual import counterfactual
from .gagpo import gagpo
from .gdpo import gdpo
from .hgpo import hgpo
from .m2po import m2po
from .passthrough import passthrough
from .replay import VerifiedSuccesses
from .seeupo import ReverseExecution


@unimas.hookimpl
def unimas_credit_shapers():
    return {"hgpo": hgpo, "gagpo": gagpo, "counterfactual": counterfactual, "gdpo": gdpo}


@unimas.hookimpl
def unimas_rollout_controls():
    return {"entropy_branch": EntropyBranch, "adaptive_budget": AdaptiveBudget}


@unimas.hookimpl
def unimas_replay_buffers():
    return {"verified_successes": VerifiedSuccesses}


@unimas.hookimpl
def unimas_update_orders():
    return {"reverse_execution": ReverseExecution}


@unimas.hookimpl
def unimas_policy_losses():
    return {"m2po": m2po}


@unimas.hookimpl
def unimas_estimators():
    return {"passthrough": passthrough}
