"""Benchmark-only workflows and datasets, loaded with ``plugins: [benchmarks.bench_workflows]``.

* ``bench_echo`` — one role: sees ``E:<letter>`` (the informative token
  last), answers; reward = the first character of the answer is the letter.
  Used for the TRL comparison (TRL's reward function applies the same rule
  to the same decoded completion) and as "one role alone" in the sharing
  benchmark.
* ``bench_relay`` — three roles in a chain: the speaker sees the letter, the
  relay sees only the speaker's output, the listener sees only the relay's
  output and names the letter. A team reward; three model calls per
  episode, each depending on the previous one.
* ``bench_chain`` — ONE role doing the relay's work: it acts three times
  with exactly the relay's prompts (template ``{tag}:{message}``), so the
  same turns and tokens go through one model as one role. The control for
  "what does mapping three roles onto the model(s) cost".
* ``bench_letters`` — one task per letter (``repeat`` times for train).
"""

from __future__ import annotations

import unimas


def first_char(text: str) -> str:
    return text.strip()[:1]


async def bench_echo(ctx, task, role: str = "echo"):
    out = await ctx.act(role)
    return {"answer": first_char(out.text)}


async def bench_relay(ctx, task):
    spoken = await ctx.act("speaker")
    relayed = await ctx.act("relay", message=spoken)
    guess = await ctx.act("listener", message=relayed)
    return {"answer": first_char(guess.text), "message": spoken.text}


async def bench_chain(ctx, task, role: str = "solo"):
    spoken = await ctx.act(role, tag="S", message=task["target"])
    relayed = await ctx.act(role, tag="R", message=spoken)
    guess = await ctx.act(role, tag="L", message=relayed)
    return {"answer": first_char(guess.text), "message": spoken.text}


def bench_letters(split: str, seed: int, letters: str = "abcdefgh", repeat: int = 1) -> list[dict]:
    rounds = 1 if split == "eval" else repeat
    return [{"id": f"{split}-{r}-{c}", "target": c, "answer": c} for r in range(rounds) for c in letters]


@unimas.hookimpl
def unimas_workflows():
    return {"bench_echo": bench_echo, "bench_relay": bench_relay, "bench_chain": bench_chain}


@unimas.hookimpl
def unimas_datasets():
    return {"bench_letters": bench_letters}
