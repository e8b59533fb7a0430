"""Built-in algorithm methods from the seed papers, each a plugin through the public hooks.

| name | hook | seed |
|---|---|---|
| ``hgpo`` | credit shaper | HGPO 000:155 |
| ``gagpo`` | credit shaper | GAGPO 000:43 |
| ``counterfactual`` | credit shaper | InfoPO 000:75, AT^2PO 000:31 |
| ``gdpo`` | credit shaper (verl's GDPO) | GDPO (verl) |
| ``entropy_branch`` | rollout control | ARPO 000:5, AT^2PO 000:31, TRACE 000:217 |
| ``adaptive_budget`` | rollout control | TRACE 000:217, StarPO-S 000:27 |
| ``verified_successes`` | replay buffer | RePO 000:9, RLEP 000:39 |
| ``reverse_execution`` | update order | SeeUPO 000:237 |
| ``m2po`` | policy loss | M2PO 000:183 |
| ``passthrough`` | estimator | (pairs with the credit shapers) |

Seed numbers refer to reference/seed-papers.md in the shared reference; docs/algorithms.md has examples.
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
