"""Rows that share a prompt compute it once (``unimas/groups/hf/shared_prompts.py``).

Sampling: the prefill forward sees each distinct prompt once (left padding included); greedy rows answer as their
prompt does alone; sharing changes no random draw (the same tokens as prefilling every row, under the same seed).
Log-probs of the update (policy, reference, recomputed) and a critic's values: the same values, and the same
gradients, as one full row per turn, from a forward over the distinct prompts only. The legacy tuple cache layout is copied too; a cache that cannot be copied is refused.
"""

from __future__ import annotations

import pytest
import torch

from unimas.groups.base import GenRequest
from unimas.groups.hf import sampling, shared_prompts
from unimas.groups.torch import critic as critic_lib
from unimas.groups.torch import batches
from tests.test_torch_backend import gen, make_group, turns_from

SHARED = ["S:a", "L:hgfedcba", "S:a", "S:bcd", "L:hgfedcba", "S:a", "a", "S:a"]


def prompt_ids(group, texts):
    return [group.policy.tokenizer(text)["input_ids"] for text in texts]


def sample(group, prompts, config, greedy=False, seed=7):
    group.generator.manual_seed(seed)
    with torch.inference_mode():
        return sampling.sample_tokens(group.policy.model, prompts, config, greedy, eos_ids=group.policy.eos_ids,
                                      pad_id=group.policy.pad_id, logit_bias=group.policy.logit_bias, generator=group.generator)


def input_shapes(model, monkeypatch) -> list[tuple[int, ...]]:
    """The shape of ``input_ids`` of every forward ``model`` runs from now on (the list fills as it runs)."""
    shapes = []
    forward = model.forward

    def spy(*args, **kwargs):
        shapes.append(tuple(kwargs["input_ids"].shape))
        return forward(*args, **kwargs)

    monkeypatch.setattr(model, "forward", spy)
    return shapes


def test_distinct_prompts_index_every_row_and_say_none_when_all_differ():
    assert shared_prompts.distinct_prompts([[1, 2], [3], [1, 2], [3], [4]]) == ([[1, 2], [3], [4]], [0, 1, 0, 1, 2])
    assert shared_prompts.distinct_prompts([[1], [1, 2], [2, 1]]) == ([[1], [1, 2], [2, 1]], None)


def test_the_prefill_forward_sees_each_distinct_prompt_once_and_decoding_sees_every_row(monkeypatch):
    group = make_group()
    widths = input_shapes(group.policy.model, monkeypatch)
    prompts = prompt_ids(group, SHARED)
    tokens, logprobs = sample(group, prompts, gen(max_new=3, require_eos=False))
    longest = max(len(p) for p in prompts)
    assert widths[0] == (4, longest)  # 4 distinct prompts, left-padded to the longest
    assert all(width == (len(SHARED), 1) for width in widths[1:]) and len(widths) >= 2
    assert len(tokens) == len(logprobs) == len(SHARED)


def test_greedy_rows_answer_as_their_prompt_does_alone():
    group = make_group(seed=3)
    prompts = prompt_ids(group, SHARED)
    tokens, logprobs = sample(group, prompts, gen(max_new=5, require_eos=False), greedy=True)
    for prompt, row, row_logprobs in zip(prompts, tokens, logprobs):
        alone_tokens, alone_logprobs = sample(group, [prompt], gen(max_new=5, require_eos=False), greedy=True)
        assert row == alone_tokens[0]
        assert row_logprobs == pytest.approx(alone_logprobs[0], abs=1e-5)


def test_sharing_changes_no_random_draw(monkeypatch):
    group = make_group(seed=1)
    prompts = prompt_ids(group, SHARED * 4)
    config = gen(max_new=6, temperature=1.3)
    shared_tokens, shared_logprobs = sample(group, prompts, config)
    monkeypatch.setattr(sampling, "distinct_prompts", lambda rows: (list(rows), None))  # every row prefilled
    every_tokens, every_logprobs = sample(group, prompts, config)
    assert shared_tokens == every_tokens
    for shared_row, every_row in zip(shared_logprobs, every_logprobs):
        assert shared_row == pytest.approx(every_row, abs=1e-5)
    assert len({tuple(row) for row in shared_tokens}) > 4  # the rows of one prompt did sample apart


def test_a_legacy_tuple_cache_is_copied_row_by_row_and_an_unknown_one_is_refused():
    keys, values = torch.arange(6.0).view(3, 2), -torch.arange(6.0).view(3, 2)
    copied = shared_prompts.copy_cache_rows(((keys, values),), torch.tensor([2, 0, 2]))
    assert torch.equal(copied[0][0], keys[[2, 0, 2]]) and torch.equal(copied[0][1], values[[2, 0, 2]])
    with pytest.raises(TypeError, match="list key/value cache"):
        shared_prompts.copy_cache_rows([keys], torch.tensor([0]))


def every_row(monkeypatch, group) -> None:
    """Every turn its own prompt: one full ``[prompt | response]`` row each (the path without sharing). The
    learner forgets the batch it remembered for the last turns (its batch cache): that one was split."""
    monkeypatch.setattr(batches, "split_forward", lambda prompts: None)
    group.learner.batches.forget()


def test_the_update_splits_its_forward_only_when_enough_prompt_tokens_are_shared():
    prompt = list(range(100))
    plan = shared_prompts.split_forward([prompt] * 4 + [[1, 2]] * 4)  # 300 + 6 prompt tokens skipped
    assert plan == ([prompt, [1, 2]], [0, 0, 0, 0, 1, 1, 1, 1])
    assert shared_prompts.split_forward([prompt] * 3) is None  # 200 skipped: below MIN_SAVED_TOKENS
    assert shared_prompts.split_forward([prompt] * 4 + [[i] for i in range(3)]) is None  # 4 of 7 distinct
    assert shared_prompts.split_forward([[i, i] for i in range(300)]) is None  # nothing shared


def same_gradient(shared: torch.Tensor, full: torch.Tensor) -> bool:
    """Equal up to float rounding, measured against the tensor's scale: summing rows in another order moves an
    element near zero by ~1e-6 of the largest, while a gradient that misses the prompt is off by its own size."""
    return float((shared - full).abs().max()) <= 1e-5 * float(full.abs().max()) + 1e-8


def shared_turns(group, monkeypatch):
    monkeypatch.setattr(shared_prompts, "MIN_SAVED_TOKENS", 0)  # short test prompts: share whatever is shared
    results = group.generate([GenRequest(text, gen(max_new=5)) for text in SHARED * 2])
    turns = turns_from(results)
    assert len({len(t.response_ids) for t in turns}) > 1  # some rows stopped at EOS: right padding is covered
    return turns


def test_log_probs_forward_the_distinct_prompts_once_and_equal_full_rows(monkeypatch):
    group = make_group(seed=2)
    turns = shared_turns(group, monkeypatch)
    widths = input_shapes(group.policy.model, monkeypatch)
    with torch.inference_mode():
        shared, _, shared_mask = group.policy.logprobs(turns, [None] * len(turns), group.learner.batches)
    assert widths[0][0] == 4 and widths[1][0] == len(turns)  # the 4 distinct prompts, then every response
    every_row(monkeypatch, group)
    with torch.inference_mode():
        full, _, mask = group.policy.logprobs(turns, [None] * len(turns), group.learner.batches)
    assert widths[2][0] == len(turns) and len(widths) == 3  # one full row per turn
    assert torch.equal(mask, shared_mask)
    assert torch.allclose(shared * mask, full * mask, atol=1e-5)


def test_gradients_through_shared_prompts_are_those_of_full_rows(monkeypatch):
    """The policy forward shares too: each prompt's gradient is summed over its rows through the cache copies."""
    group = make_group(seed=4)
    turns = shared_turns(group, monkeypatch)

    def gradients() -> tuple[torch.Tensor, list[torch.Tensor]]:
        group.policy.model.zero_grad(set_to_none=True)
        logp, entropy, mask = group.policy.logprobs(turns, [None] * len(turns), group.learner.batches, entropy=True)
        ((logp + 0.1 * entropy) * mask * torch.linspace(-1, 1, len(turns))[:, None]).sum().backward()
        return logp.detach(), [p.grad.clone() for p in group.policy.model.parameters() if p.grad is not None]

    shared_logp, shared_grads = gradients()
    every_row(monkeypatch, group)
    full_logp, full_grads = gradients()
    assert torch.allclose(shared_logp, full_logp, atol=1e-5)
    assert len(shared_grads) == len(full_grads) > 0
    for shared, full in zip(shared_grads, full_grads):
        assert same_gradient(shared, full)


def test_critic_values_and_their_gradients_through_shared_prompts_are_those_of_full_rows(monkeypatch):
    from tests.test_critic import critic_group

    group = critic_group(seed=5)
    with torch.no_grad():
        group.critic.model.head.weight.normal_()
    turns = shared_turns(group, monkeypatch)
    model = group.critic.model
    forwards = []
    monkeypatch.setattr(shared_prompts, "forward_split", lambda *a, _f=shared_prompts.forward_split, **k:
                        forwards.append(1) or _f(*a, **k))
    monkeypatch.setattr(critic_lib, "forward_split", shared_prompts.forward_split)

    def values_and_gradients() -> tuple[list[list[float]], torch.Tensor, torch.Tensor, list[torch.Tensor]]:
        read = group.critic.values(turns, len(turns), group.learner.batches)
        model.zero_grad(set_to_none=True)
        values, mask = critic_lib._values(model, turns, group.learner.batches)
        (values * mask * torch.linspace(-1, 1, len(turns))[:, None]).sum().backward()
        return read, values.detach(), mask, [p.grad.clone() for p in model.parameters() if p.grad is not None]

    shared_read, shared_values, mask, shared_grads = values_and_gradients()
    assert len(forwards) == 2  # values() and the trained forward both split
    every_row(monkeypatch, group)
    full_read, full_values, full_mask, full_grads = values_and_gradients()
    assert len(forwards) == 2 and torch.equal(mask, full_mask)
    for shared, full in zip(shared_read, full_read):
        assert shared == pytest.approx(full, abs=1e-5)
    assert torch.allclose(shared_values * mask, full_values * mask, atol=1e-5)
    assert len(shared_grads) == len(full_grads) > 0
    for shared, full in zip(shared_grads, full_grads):
        assert same_gradient(shared, full)


def test_a_model_whose_cache_rows_cannot_be_copied_computes_every_row(monkeypatch):
    """Sampling, log-probs and critic values fall back to full rows and give the same answers."""
    from tests.test_critic import critic_group

    group = critic_group(seed=6)
    turns = shared_turns(group, monkeypatch)
    prompts = prompt_ids(group, SHARED)
    config = gen(max_new=4, require_eos=False)

    def answers():
        with torch.inference_mode():
            logp, _, mask = group.policy.logprobs(turns, [None] * len(turns), group.learner.batches)
            values, _ = critic_lib._values(group.critic.model, turns, group.learner.batches)
        return sample(group, prompts, config, greedy=True), logp * mask, values * mask

    shared = answers()

    refused = []

    def unsharable(cache, rows):
        refused.append(len(rows))
        raise shared_prompts.UnsharableCache("no reorder_cache")

    monkeypatch.setattr(sampling, "copy_cache_rows", unsharable)
    monkeypatch.setattr(shared_prompts, "copy_cache_rows", unsharable)
    full = answers()
    assert refused == [len(turns), len(turns), len(prompts)]  # log-probs, values, sampling: each tried to share
    assert shared[0][0] == full[0][0]  # the same greedy tokens
    assert torch.allclose(shared[1], full[1], atol=1e-5) and torch.allclose(shared[2], full[2], atol=1e-5)
