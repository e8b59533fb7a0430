"""``passthrough``: an estimator that hands each turn's signal on unchanged.

Credit shapers that compute whole advantages (``gagpo``, ``counterfactual``,
``gdpo``, ``hgpo``) pair with it, so no second normalisation undoes theirs.
It takes no ``index``, so validation does not ask for ``group_size >= 2``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the registry lists this estimator without importing torch
    import torch


def passthrough(token_level_rewards: torch.Tensor, response_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    advantages = token_level_rewards * response_mask
    return advantages, advantages
