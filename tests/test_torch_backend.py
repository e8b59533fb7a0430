"""Tests of the in-process torch backend and its char tokenizer, and the shared loss in ``unimas.algorithms.losses``.

Every test checks a property a broken implementation would violate: equal
log-probs under padding and between sampling and training, EOS handling,
seeded determinism, that updates move the right parameters in the right
direction, learning-rate schedules, and bit-identical resume from a checkpoint.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from pydantic import ValidationError
from transformers import AutoTokenizer
from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage, get_policy_loss_fn

from unimas.algorithms import estimators, losses
from unimas.config.schema import AlgorithmConfig, GenerationConfig, LoraConfig, ModelGroupConfig, OptimConfig
from unimas.groups.base import GenRequest, GroupSpec, TrainTurn
from unimas.groups.hf.chars import build_char_tokenizer
from unimas.groups.prompts import check_known
from unimas.groups.torch import SupervisedExample, TorchBackend, TorchModelGroup, TorchOptions

ALPHABET = "abcdefgh:SL "


def group_spec(config: ModelGroupConfig, adapters=(), seed=0, total_updates=0, name="m", **algorithm) -> GroupSpec:
    """What ``unimas.runtime.build`` makes from a full config: validated options, algorithm, policy loss."""
    settings = AlgorithmConfig(**algorithm)
    return GroupSpec(name=name, config=config, options=TorchOptions.model_validate(config.options),
                     adapters=list(adapters), seed=seed, algorithm=settings,
                     policy_loss=get_policy_loss_fn(settings.loss), total_updates=total_updates)


def make_group(arch="qwen2", seed=0, adapters=(), lora=None, trainable=True, lr=1e-3, optim=None, total_updates=0,
               algorithm=None, critic=None, **tiny) -> TorchModelGroup:
    spec = dict(alphabet=ALPHABET, architecture=arch, hidden_size=32, num_layers=2, num_heads=4, max_positions=64)
    spec.update(tiny)
    config = ModelGroupConfig(options={"tiny": spec}, lora=lora, trainable=trainable,
                              optim=OptimConfig(lr=lr, **(optim or {})), critic=critic)
    return TorchModelGroup.build(group_spec(config, adapters, seed, total_updates, **(algorithm or {})))


def set_algorithm(group: TorchModelGroup, **settings) -> None:
    """Change the update settings of a built group (the trainer fixes them per run; tests vary them)."""
    group.spec.algorithm = AlgorithmConfig(**settings)


def gen(max_new=6, temperature=1.0, **kw) -> GenerationConfig:
    return GenerationConfig(max_new_tokens=max_new, temperature=temperature, **kw)


PROMPTS = ["S:a", "S:bcd", "L:hgfedcba", "a", "S:ee"]


def turns_from(results, advantage=1.0, temperature=1.0, adapter=None) -> list[TrainTurn]:
    return [
        TrainTurn(r.prompt_ids, r.response_ids, r.logprobs, advantage, rollout_logprobs_exact=r.logprobs_exact,
                  temperature=temperature, adapter=adapter)
        for r in results
    ]


def response_logprob(group, result, adapter=None) -> float:
    turn = turns_from([result], adapter=adapter)[0]
    with torch.no_grad():
        logp, _, mask = group.policy.logprobs([turn], [adapter], group.learner.batches)
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
        logp, _, mask = group.policy.logprobs(turns, [None] * len(turns), group.learner.batches)
        for row, turn in enumerate(turns):
            single, _, _ = group.policy.logprobs([turn], [None], group.learner.batches)
            n = len(turn.response_ids)
            torch.testing.assert_close(logp[row, :n], single[0, :n], atol=1e-5, rtol=0)
            assert mask[row].sum() == n


@pytest.mark.parametrize("arch,temperature", [("qwen2", 1.0), ("gpt2", 0.7), ("llama", 1.3)])
def test_rollout_logprobs_equal_training_logprobs(arch, temperature):
    group = make_group(arch)
    results = group.generate([GenRequest(p, gen(8, temperature)) for p in PROMPTS * 4])
    turns = turns_from(results, temperature=temperature)
    with torch.no_grad():
        logp, _, mask = group.policy.logprobs(turns, [None] * len(turns), group.learner.batches)
    for row, r in enumerate(results):
        np.testing.assert_allclose(logp[row, : len(r.logprobs)].numpy(), r.logprobs, atol=1e-5)
    metrics = group.update(turns)
    assert metrics["ppo_kl"] == pytest.approx(0.0, abs=1e-6) and metrics["clip_frac"] == 0.0


def test_score_is_each_turns_summed_logprob_under_the_current_weights():
    group = make_group(lr=1e-2)
    results = group.generate([GenRequest(p, gen(6, 0.7)) for p in PROMPTS])
    turns = turns_from(results, temperature=0.7)
    np.testing.assert_allclose(group.score(turns), [sum(r.logprobs) for r in results], atol=1e-5)
    group.update(turns_from(results[:1], 1.0, temperature=0.7))
    assert group.score(turns[:1])[0] > sum(results[0].logprobs) + 1e-3  # the update raised it
    assert group.score([]) == []


def test_eos_stops_and_is_included():
    group = make_group()
    eos = group.policy.tokenizer.eos_token_id
    group.policy.logit_bias[eos] = 2.5  # make EOS frequent but not certain
    results = group.generate([GenRequest(p, gen(5)) for p in PROMPTS * 10])
    assert any(r.finished for r in results) and not all(r.finished for r in results)
    for r in results:
        assert len(r.logprobs) == len(r.response_ids) >= 1
        if r.finished:
            assert r.response_ids[-1] == eos and eos not in r.response_ids[:-1]
        else:
            assert len(r.response_ids) == 5 and eos not in r.response_ids
        assert r.text == group.policy.tokenizer.decode([t for t in r.response_ids if t != eos])
        assert "<" not in r.text and " " * 2 not in r.text
    group.policy.logit_bias[eos] = 100.0
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
    assert [o.prompt_ids[-1] for o in out] == [group.policy.tokenizer.convert_tokens_to_ids(c) for c in "abcd"]


def test_long_prompts_are_cut_from_the_left():
    group = make_group(max_positions=16)
    result = group.generate([GenRequest("S:" + "abcdefgh" * 3 + "c", gen(4))])[0]
    assert len(result.prompt_ids) == 12 and result.prompt_ids[-1] == group.policy.tokenizer.convert_tokens_to_ids("c")
    assert result.truncated and result.response_ids  # cut, counted per role by the controller, and sampled


def test_a_prompt_too_long_is_not_sampled_when_cutting_is_not_allowed():
    group = make_group(max_positions=16)
    result = group.generate([GenRequest("S:" + "abcdefgh" * 3 + "c", gen(4), allow_truncation=False)])[0]
    assert result.truncated and result.response_ids == [] and len(result.prompt_ids) == 27


def test_same_seed_same_samples_different_seed_different():
    requests = [GenRequest(p, gen(8)) for p in PROMPTS * 3]
    a, b, c = make_group(seed=1), make_group(seed=1), make_group(seed=2)
    first = [r.response_ids for r in a.generate(requests)]
    assert first == [r.response_ids for r in b.generate(requests)]
    assert first != [r.response_ids for r in c.generate(requests)]
    assert first != [r.response_ids for r in a.generate(requests)]  # the generator advances


def test_sampling_runs_in_eval_mode_even_after_something_left_train_mode_on():
    """generate skips the eval() walk when the model is already in eval mode; a model left in train mode (with
    dropout on, sampling would differ from a fresh group's) is still switched."""
    def with_dropout() -> TorchModelGroup:
        group = make_group(seed=1)
        for module in group.policy.model.modules():
            if hasattr(module, "attention_dropout"):  # Qwen2 attention: applied only in train mode
                module.attention_dropout = 0.5
        return group

    requests = [GenRequest(p, gen(8)) for p in PROMPTS * 3]
    fresh = [r.response_ids for r in with_dropout().generate(requests)]
    left_on = with_dropout()
    left_on.policy.model.train()
    assert [r.response_ids for r in left_on.generate(requests)] == fresh
    assert not left_on.policy.model.training

def test_streamed_rows_report_their_text_as_it_grows_and_sample_the_same():
    """Rows with a progress callback see their text grow to the result's text (a stop string never shown);
    the other rows cost nothing extra, and a batch samples the same tokens whether its rows stream or not."""
    def batch(stream: bool, seen: dict):
        group = make_group(seed=3)
        requests = [GenRequest(p, gen(10), stop=["ab"] if i == 1 else None,
                               progress=seen.setdefault(i, []).append if stream and i < 3 else None)
                    for i, p in enumerate(PROMPTS)]
        return group.generate(requests)

    seen: dict[int, list[str]] = {}
    plain, streamed = batch(False, {}), batch(True, seen)
    assert [r.response_ids for r in streamed] == [r.response_ids for r in plain]
    assert [r.logprobs for r in streamed] == [r.logprobs for r in plain]
    for row in range(3):
        texts = seen[row]
        assert texts[0] == "" and texts[-1] == streamed[row].text
        assert all(later.startswith(earlier) and len(later) > len(earlier) for earlier, later in zip(texts[1:],
                                                                                                     texts[2:]))
        assert all("ab" not in text and not text.endswith("a") for text in texts) if row == 1 else True
    assert len(seen[0]) > 3  # one report per token: chars are one token each
    assert seen.keys() == {0, 1, 2}


def test_a_request_that_cannot_be_tokenised_fails_alone():
    """A prompt the tokenizer raises on is that request's error; the rest of the batch is sampled."""
    group = make_group()
    tokenise = group.policy.plain_prompt_ids

    def picky(texts):
        if any("h" in text for text in texts):
            raise ValueError("cannot tokenise 'h'")
        return tokenise(texts)

    group.policy.plain_prompt_ids = picky
    results = group.generate([GenRequest(p, gen(3)) for p in PROMPTS])
    failed = [r for r, p in zip(results, PROMPTS) if "h" in p]
    assert failed and all("cannot tokenise 'h'" in r.error and "'m'" in r.error and not r.response_ids
                          for r in failed)
    assert all(r.error is None and r.response_ids for r, p in zip(results, PROMPTS) if "h" not in p)


# --------------------------------------------------------------- updates


def test_positive_advantage_raises_logprob_negative_lowers():
    group = make_group(lr=1e-2)
    up, down = group.generate([GenRequest("S:a", gen(4)), GenRequest("S:b", gen(4))])
    before = response_logprob(group, up), response_logprob(group, down)
    turns = turns_from([up], 1.0) + turns_from([down], -1.0)
    for _ in range(3):
        metrics = group.update(turns)
    assert response_logprob(group, up) > before[0] + 0.1
    assert response_logprob(group, down) < before[1] - 0.1
    assert metrics["grad_norm"] > 0 and metrics["tokens"] == len(up.response_ids) + len(down.response_ids)


def test_minibatches_and_epochs_take_several_steps():
    group = make_group()
    results = group.generate([GenRequest(p, gen(4)) for p in PROMPTS * 2])
    set_algorithm(group, mini_batch_size=3, ppo_epochs=2)
    before = [p.detach().clone() for p in group.policy.train_params]
    metrics = group.update(turns_from(results))
    assert group.learner.optimizer.state[group.policy.train_params[0]]["step"] == 8  # 2 epochs x ceil(10 / 3)
    assert metrics["ppo_kl"] != 0.0  # later mini-batches see an updated policy
    assert any(not torch.equal(b, p) for b, p in zip(before, group.policy.train_params))


def lora_snapshot(group) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in group.policy.model.named_parameters()}


def test_lora_updates_only_the_turns_adapter():
    group = make_group(adapters=["x", "y"], lora=LoraConfig(r=4), lr=1e-2)
    assert group.num_parameters()["trainable"] < group.num_parameters()["total"] / 2
    results = group.generate([GenRequest(p, gen(4), adapter="x") for p in PROMPTS])
    before = lora_snapshot(group)
    group.update(turns_from(results, adapter="x"))
    after = lora_snapshot(group)
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed and all(".x." in k and "lora_" in k for k in changed)
    # now both adapters in one mini-batch: each goes through its own forward
    mixed = turns_from(results[:2], adapter="x") + turns_from(results[2:], adapter="y")
    group.update(mixed)
    changed = {k for k in after if not torch.equal(after[k], group.policy.model.get_parameter(k))}
    assert any(".x." in k for k in changed) and any(".y." in k for k in changed)
    assert all("lora_" in k for k in changed)
    assert all(p.requires_grad for p in group.policy.train_params)


def test_frozen_group_refuses_to_train():
    group = make_group(trainable=False)
    result = group.generate([GenRequest("S:a", gen(3))])[0]
    assert group.num_parameters()["trainable"] == 0
    with pytest.raises(RuntimeError, match="frozen"):
        group.update(turns_from([result]))
    with pytest.raises(RuntimeError, match="frozen"):
        group.train_supervised([SupervisedExample("S:a", "b")])


@pytest.mark.parametrize("lora", [False, True])
def test_kl_reference_only_when_needed(lora):
    kwargs = dict(adapters=["x"], lora=LoraConfig(r=4)) if lora else {}
    adapter = "x" if lora else None
    group = make_group(lr=1e-2, **kwargs)
    turns = turns_from(group.generate([GenRequest(p, gen(4), adapter=adapter) for p in PROMPTS]), adapter=adapter)
    assert group.update(turns)["kl"] == 0.0 and not group.policy.has_reference_copy
    set_algorithm(group, kl_coef=0.1, ppo_epochs=2)
    for _ in range(2):
        metrics = group.update(turns)
    assert metrics["kl"] > 0
    assert (not group.policy.has_reference_copy) == lora  # LoRA: the base with adapters off is the reference


def test_supervised_steps_learn_a_copy_task():
    group = make_group(lr=3e-3)
    examples = [SupervisedExample(f"S:{w}:", w) for w in ["abc", "hge", "dab", "fch"]]
    losses = [group.train_supervised(examples) for _ in range(40)]
    assert losses[-1] < 0.5 * losses[0]


# ----------------------------------------------------------- checkpoints


@pytest.mark.parametrize("lora", [False, True])
def test_save_load_resumes_bit_identically(tmp_path, lora):
    kwargs = dict(adapters=["x", "y"], lora=LoraConfig(r=4)) if lora else {}
    algorithm = dict(kl_coef=0.05, mini_batch_size=3)
    first = make_group(seed=3, algorithm=algorithm, **kwargs)

    def step(group):
        requests = [GenRequest(p, gen(5), adapter="y" if lora else None) for p in PROMPTS]
        results = group.generate(requests)
        metrics = group.update(turns_from(results, adapter="y" if lora else None))
        return [r.response_ids for r in results], metrics["policy_loss"]

    step(first)
    first.save(tmp_path / "ckpt")
    expected = step(first), step(first)
    resumed = make_group(seed=99, algorithm=algorithm, **kwargs)
    resumed.load(tmp_path / "ckpt")
    assert (step(resumed), step(resumed)) == expected

    config = first.spec.config.model_copy(update={"options": {"init_from": str(tmp_path / "ckpt")}})
    warm = TorchModelGroup.build(group_spec(config, kwargs.get("adapters", ())))
    reference = make_group(seed=99, **kwargs)
    reference.load(tmp_path / "ckpt")
    for (k, v), (k2, v2) in zip(warm.policy.model.named_parameters(), reference.policy.model.named_parameters()):
        assert k == k2 and torch.equal(v, v2)


# ------------------------------------------------------- exactness, schedule


def test_filtered_sampling_is_not_exact_and_update_recomputes_old_logprobs():
    group = make_group()
    plain, filtered, greedy = group.generate([GenRequest("S:a", gen(4)), GenRequest("S:b", gen(4, top_k=3)),
                                              GenRequest("S:c", gen(4, top_p=0.5), greedy=True)])
    assert plain.logprobs_exact and not filtered.logprobs_exact and greedy.logprobs_exact
    assert not group.generate([GenRequest("S:d", gen(4, top_p=0.9))])[0].logprobs_exact

    def ppo_kl(exact: bool, logprobs) -> float:
        turn = TrainTurn(filtered.prompt_ids, filtered.response_ids, logprobs, 1.0, rollout_logprobs_exact=exact)
        fresh = make_group()  # same seed: same weights as ``group``
        return fresh.update([turn])["ppo_kl"]

    wrong = [lp - 1.0 for lp in filtered.logprobs]
    assert ppo_kl(True, wrong) == pytest.approx(-1.0, abs=1e-4)  # trusted as reported
    assert ppo_kl(False, wrong) == pytest.approx(0.0, abs=1e-6)  # recomputed: on-policy again
    assert ppo_kl(True, wrong[:-1] or [0.0, 0.0]) == pytest.approx(0.0, abs=1e-6)  # wrong length: recomputed


def test_constant_schedule_keeps_the_rate_exactly():
    group = make_group(lr=3e-3, total_updates=4)
    turns = turns_from(group.generate([GenRequest(p, gen(3)) for p in PROMPTS[:2]]))
    assert [group.update(turns)["lr"] for _ in range(5)] == [3e-3] * 5
    assert group.learner.optimizer.param_groups[0]["lr"] == 3e-3


@pytest.mark.parametrize("schedule", ["linear", "cosine"])
def test_schedule_warms_up_then_decays_to_the_floor_at_the_horizon(schedule):
    optim = dict(schedule=schedule, warmup_steps=2, min_lr_ratio=0.1)
    group = make_group(lr=1e-2, optim=optim, total_updates=6)
    turns = turns_from(group.generate([GenRequest(p, gen(3)) for p in PROMPTS[:2]]))
    used = [group.update(turns)["lr"] for _ in range(6)]
    progress = [0.0, 0.25, 0.5, 0.75]
    shape = [1 - p if schedule == "linear" else 0.5 * (1 + math.cos(math.pi * p)) for p in progress]
    expected = [1e-2 / 3, 2e-2 / 3] + [1e-2 * (0.1 + 0.9 * s) for s in shape]
    assert used == pytest.approx(expected, rel=1e-9)
    assert group.learner.optimizer.param_groups[0]["lr"] == pytest.approx(1e-3, rel=1e-9)  # the floor at the horizon
    assert group.update([])["lr"] == pytest.approx(1e-3, rel=1e-9)  # and it stays there


def test_resume_restores_the_schedule(tmp_path):
    optim = dict(schedule="linear", warmup_steps=1)
    first = make_group(lr=1e-2, optim=optim, total_updates=5)
    turns = turns_from(first.generate([GenRequest(p, gen(3)) for p in PROMPTS[:2]]))
    first.update(turns), first.update(turns)
    first.save(tmp_path / "ckpt")
    expected = [first.update(turns)["lr"] for _ in range(2)]
    resumed = make_group(lr=1e-2, optim=optim, total_updates=5)
    resumed.load(tmp_path / "ckpt")
    assert [resumed.update(turns)["lr"] for _ in range(2)] == expected
    assert expected != [make_group(lr=1e-2, optim=optim, total_updates=5).update(turns)["lr"] for _ in range(2)]


# ---------------------------------------------------------------- options


def test_options_need_exactly_one_source_and_known_keys():
    tiny = {"alphabet": "ab"}
    assert TorchOptions.model_validate({"tiny": tiny}).dtype == "float32"
    with pytest.raises(ValidationError, match="exactly one.*got path and tiny"):
        TorchOptions.model_validate({"tiny": tiny, "path": "some/dir"})
    with pytest.raises(ValidationError, match="exactly one.*got none"):
        TorchOptions.model_validate({"dtype": "bfloat16"})
    with pytest.raises(ValidationError, match="extra_forbidden|Extra inputs"):
        TorchOptions.model_validate({"tiny": tiny, "pth": "x"})
    with pytest.raises(ValidationError, match="tiny.hidden"):
        TorchOptions.model_validate({"tiny": {**tiny, "hidden": 8}})
    assert all(field.description for field in TorchOptions.model_fields.values())
    assert TorchModelGroup.options is TorchOptions  # what the builder validates models.<group>.options with


def test_vocabulary_lists_tokens_without_building_a_model(tmp_path):
    words = TorchBackend.vocabulary(TorchOptions(tiny={"alphabet": "abca:"}))
    assert words == ["a", "b", "c", ":"]
    make_group().save(tmp_path / "ckpt")
    assert TorchBackend.vocabulary({"init_from": str(tmp_path / "ckpt")}) == list(dict.fromkeys(ALPHABET))
    assert TorchBackend.vocabulary({"path": str(tmp_path / "ckpt" / "model")}) == list(dict.fromkeys(ALPHABET))


# ---------------------------------------------------------- the shared loss


def test_estimator_facts_come_from_the_signature():
    grpo = estimators.Estimator.from_function("grpo", compute_grpo_outcome_advantage, "verl")
    assert grpo.group_normalised and not grpo.needs_critic and grpo.usable
    scores = torch.tensor([[1.0], [0.0], [1.0], [0.0], [0.5], [0.5]])
    index = np.array(["x", "x", "y", "y", "z", "z"], dtype=object)
    advantages = grpo(scores, index, norm_by_std=False)
    torch.testing.assert_close(advantages.squeeze(-1), torch.tensor([0.5, -0.5, 0.5, -0.5, 0.0, 0.0]))

    def needs_values(token_level_rewards, values, response_mask):
        raise AssertionError("never called")

    def needs_baselines(token_level_rewards, reward_baselines, response_mask, config=None):
        raise AssertionError("never called")

    critic = estimators.Estimator.from_function("gae_like", needs_values, "test")
    assert critic.needs_critic and not critic.usable and not critic.group_normalised
    remax = estimators.Estimator.from_function("remax_like", needs_baselines, "test")
    assert remax.missing_inputs == ("reward_baselines",) and not remax.usable


def test_compose_loss_is_policy_minus_entropy_plus_kl():
    torch.manual_seed(0)
    log_prob = (torch.randn(3, 4) - 2).requires_grad_(True)
    reference = log_prob.detach() + 0.3 * torch.randn(3, 4)
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0]], dtype=torch.float32)
    advantages = torch.tensor([[1.0], [-0.5], [2.0]]) * mask
    entropy = torch.rand(3, 4)
    settings = AlgorithmConfig(entropy_coef=0.01, kl_coef=0.1, kl_type="low_var_kl")
    loss, metrics = losses.compose_loss(get_policy_loss_fn("vanilla"), settings, log_prob=log_prob,
                                            old_log_prob=log_prob.detach(), advantages=advantages,
                                            response_mask=mask, entropy=entropy, ref_log_prob=reference)

    def token_mean(x):
        return (x * mask).sum() / mask.sum()

    diff = reference - log_prob.detach()
    low_var_kl = (diff.exp() - diff - 1).clamp(-10, 10)
    policy = -token_mean(advantages)  # on-policy: ratio 1, nothing clipped
    expected = policy - 0.01 * token_mean(entropy) + 0.1 * token_mean(low_var_kl)
    torch.testing.assert_close(loss.detach(), expected)
    assert metrics["policy_loss"] == pytest.approx(float(policy), abs=1e-6)
    assert metrics["kl"] == pytest.approx(float(token_mean(low_var_kl)), abs=1e-6)
    assert metrics["clip_frac"] == 0.0 and metrics["ppo_kl"] == pytest.approx(0.0, abs=1e-7)
    plain, _ = losses.compose_loss(get_policy_loss_fn("vanilla"), AlgorithmConfig(), log_prob=log_prob,
                                       old_log_prob=log_prob.detach(), advantages=advantages,
                                       response_mask=mask, entropy=entropy)
    plain.backward()
    torch.testing.assert_close(log_prob.grad, -advantages / mask.sum())
    with pytest.raises(ValueError, match="reference"):
        losses.compose_loss(get_policy_loss_fn("vanilla"), settings, log_prob=log_prob,
                                old_log_prob=log_prob.detach(), advantages=advantages, response_mask=mask,
                                entropy=entropy)
