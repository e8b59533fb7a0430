"""A writer drafts, an editor rewrites the draft; the team wins when the edit equals the word."""

import unimas


async def draft_and_edit(ctx, task):
    draft = await ctx.act("writer", word=task["word"])
    final = await ctx.act("editor", draft=draft)
    return {"answer": final.parsed}


def same_word(trajectory, task):
    return float(trajectory.outcome.get("answer") == task["word"])


def words(split, seed, vocabulary="abcd"):
    return [{"id": f"{split}-{w}", "word": w} for w in vocabulary]


@unimas.hookimpl
def unimas_workflows():
    return {"draft_and_edit": draft_and_edit}


@unimas.hookimpl
def unimas_rewards():
    return {"same_word": same_word}


@unimas.hookimpl
def unimas_datasets():
    return {"words": words}
