"""A frozen role behind an OpenAI-compatible endpoint, trained against by a torch role."""

import json

import pytest
import yaml

from tests.conftest import EXAMPLES
from tests.loopback import completions_server
from unimas.cli import main

CODE = dict(zip("01234567", "abcdefgh"))  # the frozen listener's fixed code: digit -> letter


class FrozenListener:
    """Stand-in for a served model (a test fixture): answers 'L:<digit>' with a fixed letter."""

    requests_seen = 0
    last_messages: list = []

    @classmethod
    def answer(cls, path, body):
        assert path in ("/v1/completions", "/v1/chat/completions") and body["model"] == "listener-v1"
        cls.requests_seen += 1
        if path == "/v1/chat/completions":
            cls.last_messages = body["messages"]
            text = CODE.get(body["messages"][-1]["content"][-1:], "?")
            return {"message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
        return {"text": CODE.get(body["prompt"][-1:], "?"), "finish_reason": "stop"}


@pytest.fixture
def endpoint():
    with completions_server(FrozenListener.answer) as url:
        yield url


def config_with_api_listener(tmp_path, endpoint):
    tree = yaml.safe_load((EXAMPLES / "quickstart_separate.yaml").read_text())
    tree["models"]["listener_model"] = {"backend": "openai", "trainable": False,
                                        "options": {"endpoint": endpoint, "api_model": "listener-v1"}}
    tree["roles"]["listener"]["trainable"] = False
    path = tmp_path / "api.yaml"
    path.write_text(yaml.safe_dump(tree))
    return path


@pytest.mark.slow
def test_speaker_learns_the_code_of_a_frozen_api_listener(tmp_path, endpoint):
    config = config_with_api_listener(tmp_path, endpoint)
    assert main(["validate", str(config)]) == 0
    assert main(["train", str(config), "--run-dir", str(tmp_path / "run"), "--set", "logging.report=false"]) == 0
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert records[0]["eval/accuracy"] <= 0.3
    assert records[-1]["eval/accuracy"] >= 0.9
    assert FrozenListener.requests_seen > 0
    assert not any(k.startswith("group/listener_model/policy") for k in records[-1])


def test_trainable_api_group_is_rejected(tmp_path, endpoint, capsys):
    config = config_with_api_listener(tmp_path, endpoint)
    tree = yaml.safe_load(config.read_text())
    tree["models"]["listener_model"]["trainable"] = True
    config.write_text(yaml.safe_dump(tree))
    assert main(["validate", str(config)]) == 2
    assert "models.listener_model.trainable" in capsys.readouterr().err


def test_chat_api_sends_the_roles_messages(endpoint):
    from unimas.config.schema import GenerationConfig
    from unimas.groups.base import GenRequest, GroupSpec
    from unimas.groups.openai import OpenAIModelGroup, OpenAIOptions

    options = OpenAIOptions(endpoint=endpoint, api_model="listener-v1", api="chat")
    group = OpenAIModelGroup.build(GroupSpec(name="judge", config=None, options=options, adapters=[], seed=0,
                                             algorithm=None))
    messages = [{"role": "system", "content": "decode"}, {"role": "user", "content": "L:3"}]
    [result] = group.generate([GenRequest(prompt="decodeL:3", generation=GenerationConfig(), messages=messages)])
    assert result.text == "d" and result.finished and FrozenListener.last_messages == messages
