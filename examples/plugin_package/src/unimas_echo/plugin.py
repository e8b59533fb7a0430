"""A writer drafts, an editor rewrites the draft; the team wins when the edit equals the word.

Written against ``import unimas`` alone: a workflow, a reward, a dataset, an
advantage estimator and a policy loss, each registered through a hook.
"""

import torch

import unimas


async def draft_and_edit(ctx: unimas.EpisodeContext, task: dict) -> dict:
    draft = await ctx.act("writer", word=task["word"])
    final = await ctx.act("editor", draft=draft)
    return {"answer": final.parsed}


def same_word(trajectory: unimas.GraphTrajectory, task: dict) -> float:
    return float(trajectory.outcome.get("answer") == task["word"])


def words(split: str, seed: int, vocabulary: str = "abcd") -> list[dict]:
    return [{"id": f"{split}-{w}", "word": w} for w in vocabulary]


def group_mean_baseline(token_level_rewards, response_mask, index, config=None):
    """Reward minus the mean reward of the turn's group (no std scaling): a plain REINFORCE baseline."""
    scores = token_level_rewards.sum(-1)
    advantages = torch.empty_like(scores)
    for key in set(index):
        members = torch.tensor([k == key for k in index])
        advantages[members] = scores[members] - scores[members].mean()
    advantages = advantages[:, None] * response_mask
    return advantages, advantages


def reinforce(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None):
    """-A * log pi on every response token, averaged over tokens; reports the ratio's drift as ``ppo_kl``."""
    per_token = -advantages * log_prob
    loss = (per_token * response_mask).sum() / response_mask.sum().clamp(min=1)
    drift = ((old_log_prob - log_prob) * response_mask).sum() / response_mask.sum().clamp(min=1)
    return loss, {"actor/ppo_kl": drift.detach()}


@unimas.hookimpl
def unimas_workflows():
    return {"draft_and_edit": draft_and_edit}


@unimas.hookimpl
def unimas_rewards():
    return {"same_word": same_word}


@unimas.hookimpl
def unimas_datasets():
    return {"words": words}


@unimas.hookimpl
def unimas_estimators():
    return {"group_mean_baseline": group_mean_baseline}


@unimas.hookimpl
def unimas_policy_losses():
    return {"reinforce": reinforce}
