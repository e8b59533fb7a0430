"""A frozen role behind an OpenAI-compatible endpoint, trained against by a torch role."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import yaml

from tests.conftest import EXAMPLES
from unimas.cli import main

CODE = dict(zip("01234567", "abcdefgh"))  # the frozen listener's fixed code: digit -> letter


class FrozenListener(BaseHTTPRequestHandler):
    """Stand-in for a served model (a test fixture): answers 'L:<digit>' with a fixed letter."""

    requests_seen = 0

    def do_POST(self):  # noqa: N802 - http.server naming
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        assert self.path in ("/v1/completions", "/v1/chat/completions") and body["model"] == "listener-v1"
        FrozenListener.requests_seen += 1
        if self.path == "/v1/chat/completions":
            FrozenListener.last_messages = body["messages"]
            text = CODE.get(body["messages"][-1]["content"][-1:], "?")
            choice = {"message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
        else:
            choice = {"text": CODE.get(body["prompt"][-1:], "?"), "finish_reason": "stop"}
        payload = json.dumps({"choices": [choice]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args):
        pass


class Server(ThreadingHTTPServer):
    request_queue_size = 128


@pytest.fixture
def endpoint():
    server = Server(("127.0.0.1", 0), FrozenListener)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def config_with_api_listener(tmp_path, endpoint):
    tree = yaml.safe_load((EXAMPLES / "quickstart_separate.yaml").read_text())
    tree["models"]["listener_model"] = {"backend": "openai", "trainable": False,
                                        "options": {"endpoint": endpoint, "api_model": "listener-v1"}}
    tree["roles"]["listener"]["trainable"] = False
    path = tmp_path / "api.yaml"
    path.write_text(yaml.safe_dump(tree))
    return path


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
    from unimas.config import GenerationConfig
    from unimas.groups.base import GenRequest, GroupSpec
    from unimas.groups.openai import OpenAIModelGroup, OpenAIOptions

    options = OpenAIOptions(endpoint=endpoint, api_model="listener-v1", api="chat")
    group = OpenAIModelGroup.build(GroupSpec(name="judge", config=None, options=options, adapters=[], seed=0,
                                             algorithm=None))
    messages = [{"role": "system", "content": "decode"}, {"role": "user", "content": "L:3"}]
    [result] = group.generate([GenRequest(prompt="decodeL:3", generation=GenerationConfig(), messages=messages)])
    assert result.text == "d" and result.finished and FrozenListener.last_messages == messages
