"""Tests of the in-process torch backend, its char tokenizer and the verl wrappers.

Every test checks a property a broken implementation would violate: equal
log-probs under padding and between sampling and training, EOS handling,
seeded determinism, that updates move the right parameters in the right
direction, and bit-identical resume from a checkpoint.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer

from unimas import verl_compat
from unimas.backends.base import GenRequest, SupervisedExample, TrainTurn
from unimas.backends.chars import build_char_tokenizer, check_known
from unimas.backends.torch_backend import TorchModelGroup
from unimas.config import AlgorithmConfig, GenerationConfig, LoraConfig, ModelGroupConfig, OptimConfig, TinyModelConfig

ALPHABET = "abcdefgh:SL "


def make_group(arch="qwen2", seed=0, adapters=(), lora=None, trainable=True, lr=1e-3, **tiny) -> TorchModelGroup:
    spec = dict(alphabet=ALPHABET, architecture=arch, hidden_size=32, num_layers=2, num_heads=4, max_positions=64)
    spec.update(tiny)
    config = ModelGroupConfig(tiny=TinyModelConfig(**spec), lora=lora, trainable=trainable, optim=OptimConfig(lr=lr))
    return TorchModelGroup.from_config("m", config, list(adapters), seed)


def gen(max_new=6, temperature=1.0, **kw) -> GenerationConfig:
    return GenerationConfig(max_new_tokens=max_new, temperature=temperature, **kw)


PROMPTS = ["S:a", "S:bcd", "L:hgfedcba", "a", "S:ee"]


def turns_from(results, advantage=1.0, temperature=1.0, adapter=None) -> list[TrainTurn]:
    return [
        TrainTurn(r.prompt_ids, r.response_ids, r.logprobs, advantage, temperature=temperature, adapter=adapter)
        for r in results
    ]


def response_logprob(group, result, adapter=None) -> float:
    turn = turns_from([result], adapter=adapter)[0]
    with torch.no_grad():
        logp, _, mask = group._logprobs(group.model, [turn], [adapter])
    return float((logp * mask).sum())


# ------------------------------------------------------------- tokenizer


def test_char_tokenizer_one_id_per_char_and_round_trip(tmp_path):
    tok = build_char_tokenizer(ALPHABET)
    text = "S:ab c"
    ids = tok(text)["input_ids"]
    assert len(ids) == len(text) and tok.decode(ids) == text
    spelled = build_char_tokenizer("a<>eosb")("a<eos>b")["input_ids"]  # never read as the EOS token
    assert len(spelled) == 7 and tok.eos_token_id not in spelled
    with pytest.raises(ValueError, match="'<'"):  # '<' is not in ALPHABET
        check_known(tok, "a<b", tok("a<b")["input_ids"])
    batch = tok(["a", "abc"], padding=True)["input_ids"]
    assert batch[0][:2] == [tok.pad_token_id] * 2  # left padding
    assert tok.decode(ids + [tok.eos_token_id], skip_special_tokens=True) == text
    tok.save_pretrained(tmp_path)
    again = AutoTokenizer.from_pretrained(tmp_path)
    assert again(text)["input_ids"] == ids and again.padding_side == "left"


# ------------------------------------------------------------ log-probs


@pytest.mark.parametrize("arch", ["qwen2", "gpt2"])
def test_padding_does_not_change_logprobs(arch):
    group = make_group(arch)
    batch = group.generate([GenRequest(p, gen(6)) for p in PROMPTS])
    for prompt, together in zip(PROMPTS, group.generate([GenRequest(p, gen(6), greedy=True) for p in PROMPTS])):
        alone = group.generate([GenRequest(prompt, gen(6), greedy=True)])[0]
        assert alone.response_ids == together.response_ids
        np.testing.assert_allclose(alone.logprobs, together.logprobs, atol=1e-5)
    turns = turns_from(batch)
    with torch.no_grad():
        logp, _, mask = group._logprobs(group.model, turns, [None] * len(turns))
        for row, turn in enumerate(turns):
            single, _, _ = group._logprobs(group.model, [turn], [None])
            n = len(turn.response_ids)
            torch.testing.assert_close(logp[row, :n], single[0, :n], atol=1e-5, rtol=0)
            assert mask[row].sum() == n


@pytest.mark.parametrize("arch,temperature", [("qwen2", 1.0), ("gpt2", 0.7), ("llama", 1.3)])
def test_rollout_logprobs_equal_training_logprobs(arch, temperature):
    group = make_group(arch)
    results = group.generate([GenRequest(p, gen(8, temperature)) for p in PROMPTS * 4])
    turns = turns_from(results, temperature=temperature)
    with torch.no_grad():
        logp, _, mask = group._logprobs(group.model, turns, [None] * len(turns))
    for row, r in enumerate(results):
        np.testing.assert_allclose(logp[row, : len(r.logprobs)].numpy(), r.logprobs, atol=1e-5)
    metrics = group.update(turns, AlgorithmConfig())
    assert metrics["ppo_kl"] == pytest.approx(0.0, abs=1e-6) and metrics["clip_frac"] == 0.0


def test_eos_stops_and_is_included():
    group = make_group()
    eos = group.tokenizer.eos_token_id
    group._logit_bias[eos] = 2.5  # make EOS frequent but not certain
    results = group.generate([GenRequest(p, gen(5)) for p in PROMPTS * 10])
    assert any(r.finished for r in results) and not all(r.finished for r in results)
    for r in results:
        assert len(r.logprobs) == len(r.response_ids) >= 1
        if r.finished:
            assert r.response_ids[-1] == eos and eos not in r.response_ids[:-1]
        else:
            assert len(r.response_ids) == 5 and eos not in r.response_ids
        assert r.text == group.tokenizer.decode([t for t in r.response_ids if t != eos])
        assert "<" not in r.text and " " * 2 not in r.text
    group._logit_bias[eos] = 100.0
    only = group.generate([GenRequest("S:a", gen(5))])[0]
    assert only.response_ids == [eos] and only.finished and only.text == ""


def test_mixed_settings_keep_order_and_greedy_matches():
    group = make_group(adapters=["x"], lora=LoraConfig(r=4))
    requests = [
        GenRequest("S:a", gen(4), greedy=True),
        GenRequest("S:b", gen(3, 0.5, top_k=3)),
        GenRequest("S:c", gen(4), adapter="x", greedy=True),
        GenRequest("S:d", gen(2, 1.0, top_p=0.5)),
    ]
    out = group.generate(requests)
    assert [len(o.response_ids) <= r.generation.max_new_tokens for o, r in zip(out, requests)] == [True] * 4
    assert out[0].response_ids == group.generate([requests[0]])[0].response_ids
    assert out[2].response_ids == group.generate([requests[2]])[0].response_ids
    assert [o.prompt_ids[-1] for o in out] == [group.tokenizer.convert_tokens_to_ids(c) for c in "abcd"]


def test_long_prompts_are_cut_from_the_left():
    group = make_group(max_positions=16)
    result = group.generate([GenRequest("S:" + "abcdefgh" * 3 + "c", gen(4))])[0]
    assert len(result.prompt_ids) == 12 and result.prompt_ids[-1] == group.tokenizer.convert_tokens_to_ids("c")
    assert group.truncated_prompts == 1


def test_same_seed_same_samples_different_seed_different():
    requests = [GenRequest(p, gen(8)) for p in PROMPTS * 3]
    a, b, c = make_group(seed=1), make_group(seed=1), make_group(seed=2)
    first = [r.response_ids for r in a.generate(requests)]
    assert first == [r.response_ids for r in b.generate(requests)]
    assert first != [r.response_ids for r in c.generate(requests)]
    assert first != [r.response_ids for r in a.generate(requests)]  # the generator advances


# --------------------------------------------------------------- updates


def test_positive_advantage_raises_logprob_negative_lowers():
    group = make_group(lr=1e-2)
    up, down = group.generate([GenRequest("S:a", gen(4)), GenRequest("S:b", gen(4))])
    before = response_logprob(group, up), response_logprob(group, down)
    turns = turns_from([up], 1.0) + turns_from([down], -1.0)
    for _ in range(3):
        metrics = group.update(turns, AlgorithmConfig())
    assert response_logprob(group, up) > before[0] + 0.1
    assert response_logprob(group, down) < before[1] - 0.1
    assert metrics["grad_norm"] > 0 and metrics["tokens"] == len(up.response_ids) + len(down.response_ids)


def test_minibatches_and_epochs_take_several_steps():
    group = make_group()
    results = group.generate([GenRequest(p, gen(4)) for p in PROMPTS * 2])
    algorithm = AlgorithmConfig(mini_batch_size=3, ppo_epochs=2)
    before = [p.detach().clone() for p in group._train_params]
    metrics = group.update(turns_from(results), algorithm)
    assert group._optimizer.state[group._train_params[0]]["step"] == 8  # 2 epochs x ceil(10 / 3)
    assert metrics["ppo_kl"] != 0.0  # later mini-batches see an updated policy
    assert any(not torch.equal(b, p) for b, p in zip(before, group._train_params))


def lora_snapshot(group) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in group.model.named_parameters()}


def test_lora_updates_only_the_turns_adapter():
    group = make_group(adapters=["x", "y"], lora=LoraConfig(r=4), lr=1e-2)
    assert group.num_parameters()["trainable"] < group.num_parameters()["total"] / 2
    results = group.generate([GenRequest(p, gen(4), adapter="x") for p in PROMPTS])
    before = lora_snapshot(group)
    group.update(turns_from(results, adapter="x"), AlgorithmConfig())
    after = lora_snapshot(group)
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed and all(".x." in k and "lora_" in k for k in changed)
    # now both adapters in one mini-batch: each goes through its own forward
    mixed = turns_from(results[:2], adapter="x") + turns_from(results[2:], adapter="y")
    group.update(mixed, AlgorithmConfig())
    changed = {k for k in after if not torch.equal(after[k], group.model.get_parameter(k))}
    assert any(".x." in k for k in changed) and any(".y." in k for k in changed)
    assert all("lora_" in k for k in changed)
    assert all(p.requires_grad for p in group._train_params)


def test_frozen_group_refuses_to_train():
    group = make_group(trainable=False)
    result = group.generate([GenRequest("S:a", gen(3))])[0]
    assert group.num_parameters()["trainable"] == 0
    with pytest.raises(RuntimeError, match="frozen"):
        group.update(turns_from([result]), AlgorithmConfig())
    with pytest.raises(RuntimeError, match="frozen"):
        group.train_supervised([SupervisedExample("S:a", "b")])


@pytest.mark.parametrize("lora", [False, True])
def test_kl_reference_only_when_needed(lora):
    kwargs = dict(adapters=["x"], lora=LoraConfig(r=4)) if lora else {}
    adapter = "x" if lora else None
    group = make_group(lr=1e-2, **kwargs)
    turns = turns_from(group.generate([GenRequest(p, gen(4), adapter=adapter) for p in PROMPTS]), adapter=adapter)
    assert group.update(turns, AlgorithmConfig())["kl"] == 0.0 and group._reference is None
    with_kl = AlgorithmConfig(kl_coef=0.1, ppo_epochs=2)
    for _ in range(2):
        metrics = group.update(turns, with_kl)
    assert metrics["kl"] > 0
    assert (group._reference is None) == lora  # LoRA: the base with adapters off is the reference


def test_supervised_steps_learn_a_copy_task():
    group = make_group(lr=3e-3)
    examples = [SupervisedExample(f"S:{w}:", w) for w in ["abc", "hge", "dab", "fch"]]
    losses = [group.train_supervised(examples) for _ in range(40)]
    assert losses[-1] < 0.5 * losses[0]


# ----------------------------------------------------------- checkpoints


@pytest.mark.parametrize("lora", [False, True])
def test_save_load_resumes_bit_identically(tmp_path, lora):
    kwargs = dict(adapters=["x", "y"], lora=LoraConfig(r=4)) if lora else {}
    algorithm = AlgorithmConfig(kl_coef=0.05, mini_batch_size=3)
    first = make_group(seed=3, **kwargs)

    def step(group):
        requests = [GenRequest(p, gen(5), adapter="y" if lora else None) for p in PROMPTS]
        results = group.generate(requests)
        metrics = group.update(turns_from(results, adapter="y" if lora else None), algorithm)
        return [r.response_ids for r in results], metrics["policy_loss"]

    step(first)
    first.save(tmp_path / "ckpt")
    expected = step(first), step(first)
    resumed = make_group(seed=99, **kwargs)
    resumed.load(tmp_path / "ckpt")
    assert (step(resumed), step(resumed)) == expected

    config = first.config.model_copy(update={"init_from": str(tmp_path / "ckpt"), "tiny": None})
    warm = TorchModelGroup.from_config("m", config, list(kwargs.get("adapters", [])), 0)
    reference = make_group(seed=99, **kwargs)
    reference.load(tmp_path / "ckpt")
    for (k, v), (k2, v2) in zip(warm.model.named_parameters(), reference.model.named_parameters()):
        assert k == k2 and torch.equal(v, v2)


# ------------------------------------------------------------------ verl


def test_verl_estimators_on_one_credit_per_turn():
    rewards = torch.tensor([[1.0], [0.0], [1.0], [0.0], [0.5], [0.5]])
    mask = torch.ones_like(rewards)
    index = np.array(["x", "x", "y", "y", "z", "z"], dtype=object)
    grpo = verl_compat.compute_estimator("grpo", rewards, mask, index, norm_by_std=False, gamma=1.0)
    torch.testing.assert_close(grpo.squeeze(-1), torch.tensor([0.5, -0.5, 0.5, -0.5, 0.0, 0.0]))
    rloo = verl_compat.compute_estimator("rloo", rewards, mask, index)
    torch.testing.assert_close(rloo.squeeze(-1), torch.tensor([1.0, -1.0, 1.0, -1.0, 0.0, 0.0]))
    assert verl_compat.compute_estimator("reinforce_plus_plus", rewards, mask, index).shape == (6, 1)
    with pytest.raises(KeyError, match="unknown advantage estimator"):
        verl_compat.advantage_estimator("nope")
    with pytest.raises(ValueError, match="values"):
        verl_compat.compute_estimator("gae", rewards, mask, index)
    assert {"grpo", "rloo"} <= set(verl_compat.estimator_names())
    assert {"vanilla", "gspo"} <= set(verl_compat.policy_loss_names())
