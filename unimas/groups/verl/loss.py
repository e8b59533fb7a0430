"""The losses verl's engines call for a unimas group: the policy's shared composition, fed with unimas's
advantages, and the critic's clipped value loss (:mod:`.critic`).

Their own module because both trainers (:mod:`.workers`) hand them to verl, the
worker-group one by pickling them to every rank.
"""

from __future__ import annotations

from typing import Any

import torch

from unimas.algorithms import losses


def unimas_loss(policy_loss: Any, algorithm: Any, model_output: Any, data: Any, dp_group: Any = None):
    """verl loss-function signature around unimas's shared loss composition (one micro-batch = one mini-batch)."""
    from verl.workers.utils.padding import no_padding_2_padding

    log_prob = no_padding_2_padding(model_output["log_probs"], data)
    entropy = model_output.get("entropy", None)
    entropy = torch.zeros_like(log_prob) if entropy is None else no_padding_2_padding(entropy, data)
    keys = ["response_mask", "old_log_probs", "advantages"] + (["ref_log_prob"] if "ref_log_prob" in data else [])
    keys += ["token_weight", "entropy_coef"] if "token_weight" in data else []  # per-role terms (turn_rows.py)
    fields = data.select(*keys).to_padded_tensor()
    return losses.compose_loss(policy_loss, algorithm, log_prob=log_prob, old_log_prob=fields["old_log_probs"],
                                   advantages=fields["advantages"], response_mask=fields["response_mask"].float(),
                                   entropy=entropy, ref_log_prob=fields.get("ref_log_prob", None),
                                   token_weight=fields.get("token_weight", None),
                                   entropy_coef=fields.get("entropy_coef", None))


def unimas_value_loss(value_clip: float, loss_agg_mode: str, model_output: Any, data: Any, dp_group: Any = None):
    """verl loss-function signature around the clipped value loss every backend's critic trains on.

    ``old_values`` are the critic's values before the update (the clipping centre), ``returns`` GAE's targets.
    """
    from verl.workers.utils.padding import no_padding_2_padding

    values = no_padding_2_padding(model_output["values"], data).float()
    fields = data.select("response_mask", "old_values", "returns").to_padded_tensor()
    loss, clip_frac = losses.value_loss(values, fields["old_values"], fields["returns"],
                                            fields["response_mask"].float(), value_clip, loss_agg_mode)
    return loss, {"value_loss": float(loss.detach()), "value_clip_frac": clip_frac}
