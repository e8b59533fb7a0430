"""Chat models: template rendering, conversation memory and token-exact multi-turn traces on the built test model."""

from __future__ import annotations

import asyncio

import pytest
from transformers import AutoTokenizer

from unimas.config.loading import config_from_dict
from unimas.controller.episodes import Controller
from unimas.controller.router import Router
from unimas.controller.specs import EpisodeSpec
from unimas.groups.base import TrainTurn
from unimas.preflight.summary import summary
from unimas.preflight.validate import validate
from unimas.runtime.local import LocalTransport


async def three_rounds(ctx, task):
    """`asker` acts three times and remembers its conversation; `answerer` sees one question at a time."""
    reply = None
    for round_ in range(3):
        question = await ctx.act("asker", topic=task["topic"] if reply is None else reply.text, round=round_)
        reply = await ctx.act("answerer", question=question)
    return {"answer": reply.text}


def chat_config(model_dir, **asker):
    return config_from_dict({
        "models": {"chat": {"options": {"path": str(model_dir)}}},
        "roles": {
            "asker": {"model": "chat", "system": "You ask short questions.", "template": "round {round}: {topic}",
                      "memory": "own", "generation": {"max_new_tokens": 6, "require_eos": False}, **asker},
            "answerer": {"model": "chat", "template": "{question}",
                         "generation": {"max_new_tokens": 4, "require_eos": False}},
        },
        "workflow": {"name": "signalling"}, "data": {"name": "signalling"}, "rewards": [{"name": "exact_match"}],
        "algorithm": {"group_size": 2},
    })


def run_episodes(config, episodes=4):
    experiment = validate(config)
    transport = LocalTransport.start(config, experiment.registry)
    controller = Controller(three_rounds, config.roles, Router(transport, 64, 0.001), {})
    specs = [EpisodeSpec(f"e{i}", f"t{i}", {"topic": f"topic {i}"}) for i in range(episodes)]
    return asyncio.run(controller.run(specs)), transport.groups["chat"]


@pytest.fixture(scope="module")
def episodes(chat_model):
    return run_episodes(chat_config(chat_model))


def test_a_remembering_role_extends_its_own_ids_exactly(episodes):
    trajectories, group = episodes
    for traj in trajectories:
        assert not traj.failed, traj.error
        turns = traj.turns("asker")
        assert len(turns) == 3 and not turns[0].continued and all(t.continued for t in turns[1:])
        for before, after in zip(turns, turns[1:]):
            sampled = before.prompt_ids + before.response_ids  # what the model saw, then what it produced
            assert after.prompt_ids[: len(sampled)] == sampled
            assert before.id in {source for source, _ in traj.graph.in_edges(after.id)}  # the prompt contains it


def test_prompts_match_the_tokenizers_own_rendering_of_the_conversation(episodes, chat_model):
    """Text-level equality always; id-level equality where the sampled ids are the tokenizer's own encoding."""
    tokenizer = AutoTokenizer.from_pretrained(chat_model, local_files_only=True)
    trajectories, _ = episodes
    canonical = 0
    for traj in trajectories:
        for turn in traj.turns("asker"):
            rendered = tokenizer.apply_chat_template(turn.messages, tokenize=False, add_generation_prompt=True)
            assert tokenizer.decode(turn.prompt_ids, skip_special_tokens=False) == rendered
            assert turn.prompt == rendered and "<|im_start|>assistant\n" in turn.prompt
            assert [m["role"] for m in turn.messages] == ["system"] + ["user", "assistant"] * turn.role_turn_index \
                + ["user"]
            if tokenizer(rendered, add_special_tokens=False)["input_ids"] == turn.prompt_ids:
                canonical += 1
    assert canonical >= 4  # at least every first turn; later ones whenever the model sampled canonical BPE ids


def test_trained_ids_reproduce_the_sampled_log_probs(episodes):
    trajectories, group = episodes
    turns = [TrainTurn(t.prompt_ids, t.response_ids, t.logprobs, advantage=0.0, rollout_logprobs_exact=True)
             for traj in trajectories for t in traj.turns() if t.response_ids]
    metrics = group.update(turns)
    assert metrics["rollout_logprob_diff"] < 1e-5


def test_a_one_shot_role_sees_only_its_input(episodes):
    trajectories, _ = episodes
    for turn in trajectories[0].turns("answerer"):
        assert not turn.continued and turn.messages == []  # memory none keeps trajectories lean
        assert turn.prompt.startswith("<|im_start|>user\n") and turn.prompt.count("<|im_start|>") == 2


def test_shared_memory_sees_the_other_roles_turns(chat_model):
    trajectories, _ = run_episodes(chat_config(chat_model, memory="shared"), episodes=1)
    last = trajectories[0].turns("asker")[2]
    answers = [m for m in last.messages if m["role"] == "user" and m["content"].startswith("answerer: ")]
    assert len(answers) == 2 and last.continued
    sources = {s for s, _ in trajectories[0].graph.in_edges(last.id)}
    assert {t.id for t in trajectories[0].turns("answerer")[:2]} <= sources


def test_chat_off_renders_plain_text(chat_model):
    trajectories, _ = run_episodes(chat_config(chat_model, chat="off", memory="none"), episodes=1)
    first = trajectories[0].turns("asker")[0]
    assert "<|im_start|>" not in first.prompt and first.prompt == "You ask short questions.round 0: topic 0"


def test_validate_reports_template_use_and_memory(chat_model):
    text = summary(validate(chat_config(chat_model)))
    assert "asker -> chat (chat template, memory own)" in text
    assert "answerer -> chat (chat template, memory none)" in text


@pytest.mark.slow
def test_the_chat_quickstart_learns(chat_model, tmp_path, repo):
    """Signalling through the chat template on the test model: from its step-0 accuracy to perfect."""
    from unimas.cli import main
    from unimas.output.metrics import read_metrics

    run = tmp_path / "run"
    assert main(["train", str(repo / "examples" / "quickstart_chat.yaml"), "--run-dir", str(run),
                 "--set", f"models.shared.options.path={chat_model}", "--set", "logging.report=false",
                 "--set", "trainer.steps=60"]) == 0
    evals = [r["eval/accuracy"] for r in read_metrics(run / "metrics.jsonl") if "eval/accuracy" in r]
    assert evals[0] <= 0.7 and evals[-1] >= evals[0] + 0.25 and evals[-1] >= 0.95


def test_plain_prompt_ids_tokenise_each_text_once_and_hand_out_copies():
    from unimas.groups.hf.chars import build_char_tokenizer
    from unimas.groups.hf.chat import PlainPromptIds

    class Counting:
        """The char tokenizer, counting the texts it is asked to encode."""

        def __init__(self):
            self.inner, self.texts = build_char_tokenizer("abc"), []

        def __call__(self, texts, **kwargs):
            self.texts += texts
            return self.inner(texts, **kwargs)

    tokenizer = Counting()
    prompt_ids = PlainPromptIds(tokenizer, capacity=3)
    first = prompt_ids(["ab", "ab", "c"])
    assert first == tokenizer.inner(["ab", "ab", "c"], add_special_tokens=True)["input_ids"]
    first[0].append(99)  # a caller's list is its own
    assert prompt_ids(["ab", "c"]) == [first[1], first[2]]  # the memo kept its own copy of "ab"
    assert tokenizer.texts == ["ab", "c"]  # repeated texts were not tokenised again
    prompt_ids(["ba", "cc"])  # 2 + 2 texts > capacity 3: the memo starts over
    prompt_ids(["ab"])
    assert tokenizer.texts == ["ab", "c", "ba", "cc", "ab"]
    # full again, with a text the memo holds in the same batch: it starts over with the whole batch
    assert prompt_ids(["ab", "bb"]) == tokenizer.inner(["ab", "bb"], add_special_tokens=True)["input_ids"]
    assert tokenizer.texts[-2:] == ["ab", "bb"]


STRICT_TEMPLATE_CHECK = (
    "{%- for message in messages %}{%- if loop.index0 > 0 and message['role'] == messages[loop.index0 - 1]['role'] "
    "%}{{ raise_exception('Conversation roles must alternate') }}{%- endif %}{%- endfor %}")


def strict_model(chat_model, directory):
    """The test chat model with a template that raises on two messages of one role in a row (as Llama's and
    Mistral's do)."""
    import shutil

    target = directory / "strict-chat"
    shutil.copytree(chat_model, target)
    tokenizer = AutoTokenizer.from_pretrained(target)
    tokenizer.chat_template = STRICT_TEMPLATE_CHECK + tokenizer.chat_template
    tokenizer.save_pretrained(target)
    return target


def test_a_request_the_template_cannot_render_fails_alone_and_the_batch_goes_on(chat_model, tmp_path):
    """Through the router and the torch group: one request of a batch makes the chat template raise; it gets
    its error as its result, the others are sampled (and the batch really was one batch)."""
    from unimas.config.schema import GenerationConfig
    from unimas.groups.base import GenRequest

    config = chat_config(strict_model(chat_model, tmp_path))
    transport = LocalTransport.start(config, validate(config).registry)
    router = Router(transport, 64, 10.0)
    generation = GenerationConfig(max_new_tokens=3, require_eos=False)
    good = [{"role": "user", "content": "hi"}]
    bad = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "a"},
           {"role": "assistant", "content": "b"}]

    async def one(messages, name):
        router.episode_started()
        try:
            return await router.submit("chat", GenRequest(prompt="", generation=generation, messages=messages),
                                       episode=name)
        finally:
            router.episode_finished()

    async def batch():
        return await asyncio.gather(one(good, "e0"), one(bad, "e1"), one(good, "e2"))

    try:
        first, refused, last = asyncio.run(batch())
    finally:
        transport.shutdown()
    assert router.batches == [("chat", 3)]
    assert refused.error and "Conversation roles must alternate" in refused.error and "'chat'" in refused.error
    assert refused.response_ids == [] and refused.logprobs == []
    for result in (first, last):
        assert result.error is None and 0 < len(result.response_ids) == len(result.logprobs)


def test_streamed_text_is_complete_characters_and_never_a_possible_stop():
    from unimas.groups.streaming import TextProgress, shown_text

    assert shown_text("ab\ufffd") == "ab"  # the first bytes of a character that is not complete yet
    assert shown_text("answer: 4 EN", ["END"]) == "answer: 4 "  # "EN" may become the stop string
    assert shown_text("answer: 4 ENDx", ["END"]) == "answer: 4 "  # never anything from the stop string on
    assert shown_text("answer: E4", ["END"]) == "answer: E4"  # "E4" cannot start it: shown
    assert shown_text("x", ["xy", "x"]) == ""
    reported = []
    pieces = {1: "\ufffd", 2: "é", 3: "é E", 4: "é EN", 5: "é ENX"}
    progress = TextProgress(lambda ids: pieces[len(ids)], ["END"], reported.append)
    progress.start()
    for token in range(5):
        progress.add(token)
    assert reported == ["", "é", "é ", "é ENX"]


def test_a_verl_groups_prompt_that_the_template_cannot_render_is_that_requests_error(chat_model, tmp_path):
    from unimas.config.schema import GenerationConfig
    from unimas.groups.base import GenRequest
    from unimas.groups.verl.prompts import render

    tokenizer = AutoTokenizer.from_pretrained(strict_model(chat_model, tmp_path))
    generation = GenerationConfig(max_new_tokens=2)
    bad = GenRequest(prompt="", generation=generation, messages=[{"role": "user", "content": "a"}] * 2)
    refused = render(tokenizer, bad, "g", 128, 0)
    assert refused.ids == [] and "model group 'g'" in refused.error and "roles must alternate" in refused.error
    good = render(tokenizer, GenRequest(prompt="", generation=generation, messages=bad.messages[:1]), "g", 128, 0)
    assert good.error == "" and good.ids
