"""Retrieval QA: answer normalisation and rewards, the synthetic world, BM25 and HTTP retrievers, example configs."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import pytest
import yaml
from unimas_plugins.retrievers import (
    RetrievalError,
    bm25_search,
    format_passages,
    http_search,
    synthetic_questions,
    synthetic_world,
)
from unimas_workflows.retrieval_qa import (
    em_score,
    f1_score,
    normalize_answer,
    qa_exact_match,
    qa_f1,
    qa_f1_delta,
    retrieval_qa_synthetic,
)

from unimas.cli import main
from unimas.trajectory import GraphTrajectory, ToolNode, TurnNode, read_jsonl

EXAMPLES = ["retrieval_qa_cpu.yaml", "retrieval_qa_graph_cpu.yaml", "retrieval_qa_real_model.yaml"]
SHORT = ["--set", "trainer.steps=2", "--set", "trainer.tasks_per_step=2", "--set", "trainer.eval_size=2",
         "--set", "trainer.eval_every=0", "--set", "algorithm.group_size=2", "--set", "logging.report=false",
         "--set", "trainer.save_every=0"]


# -- normalisation and rewards ----------------------------------------------------------------------

@pytest.mark.parametrize(("prediction", "gold"), [
    ("The Eiffel Tower", "eiffel tower"),        # article and case
    ("  Paris.  ", "paris"),                      # punctuation and whitespace
    ("an   apple!", "Apple"),                     # article, spaces, punctuation
    ("Rock 'n' Roll", "rock n roll"),             # inner punctuation
    ("A\tB\nC", "a b c"),                         # "a" is an article: -> "b c" on both sides
])
def test_exact_match_normalises_articles_punctuation_case_and_whitespace(prediction, gold):
    assert em_score(prediction, gold) == 1.0
    assert f1_score(prediction, gold) == 1.0


def test_normalisation_and_f1_partial_overlap():
    assert normalize_answer("  The  Quick, brown FOX!  ") == "quick brown fox"
    assert normalize_answer("theatre") == "theatre"                         # only whole-word articles go
    assert em_score("Paris France", "Paris") == 0.0
    assert f1_score("Paris France", "Paris") == pytest.approx(2 / 3)         # precision 1/2, recall 1
    assert f1_score("new york city", "New York") == pytest.approx(0.8)       # p 2/3, r 1
    assert f1_score("the city", "a town") == 0.0
    assert f1_score("york york", "york") == pytest.approx(2 / 3)             # counts clipped by the gold counts
    assert f1_score(None, "paris") == 0.0 and em_score(None, "paris") == 0.0
    assert f1_score("the", "a") == 1.0                                       # both normalise to empty


def _trajectory(answers, gold="Sudelvik", rewriter=True):
    trajectory = GraphTrajectory("e0", "t0", task={"question": "q", "answer": gold})
    for index, answer in enumerate(answers):
        if rewriter:
            trajectory.add_node(TurnNode(f"rewriter#{index}", "rewriter", "team", "", text="q",
                                         parsed="q", role_turn_index=index))
        parsed, error = (answer, None) if answer is not None else (None, "the output is empty")
        trajectory.add_node(TurnNode(f"answerer#{index}", "answerer", "team", "", text=answer or "",
                                     parsed=parsed, parse_error=error, role_turn_index=index))
    trajectory.outcome = {"answer": trajectory.turns("answerer")[-1].parsed}
    return trajectory


def test_trajectory_rewards_read_the_outcome_and_accept_aliases():
    trajectory = _trajectory(["the sudelvik."])
    assert qa_exact_match(trajectory, trajectory.task) == 1.0
    assert qa_f1(trajectory, trajectory.task) == 1.0
    partial = _trajectory(["Sudelvik harbour"])
    assert qa_exact_match(partial, partial.task) == 0.0 and qa_f1(partial, partial.task) == pytest.approx(2 / 3)
    assert qa_exact_match(partial, {"answer": ["Paris", "Sudelvik harbour"]}) == 1.0
    assert qa_exact_match(_trajectory([None]), {"answer": "x"}) == 0.0


def test_f1_delta_gives_each_round_its_improvement():
    trajectory = _trajectory(["Sudelvik harbour", "Sudelvik", "nothing"])
    deltas = qa_f1_delta(trajectory, trajectory.task)
    assert deltas == pytest.approx({"rewriter#0": 2 / 3, "answerer#0": 2 / 3, "rewriter#1": 1 / 3,
                                    "answerer#1": 1 / 3, "rewriter#2": -1.0, "answerer#2": -1.0})
    final_f1 = qa_f1(trajectory, trajectory.task)
    assert sum(v for k, v in deltas.items() if k.startswith("answerer")) == pytest.approx(final_f1)
    assert qa_f1_delta(trajectory, trajectory.task, roles=["answerer"]).keys() == {"answerer#0", "answerer#1",
                                                                                  "answerer#2"}
    no_rewriter = _trajectory([None, "Sudelvik"], rewriter=False)                 # a parse error scores 0
    assert qa_f1_delta(no_rewriter, no_rewriter.task) == {"answerer#0": 0.0, "answerer#1": 1.0}


# -- synthetic data and BM25 -------------------------------------------------------------------------

def test_synthetic_world_is_deterministic_and_its_questions_are_answerable():
    assert synthetic_world(3, 40) == synthetic_world(3, 40)
    assert synthetic_world(3, 40) != synthetic_world(4, 40)
    passages = {p["id"]: p["text"] for p in synthetic_world(0, 60)["passages"]}
    questions = synthetic_questions(0, 60)
    assert len(questions) == 120 and len({q["question"] for q in questions}) == 120
    for question in questions:
        assert question["answer"] in passages[question["supporting"][-1]]      # the second hop holds the answer
    train, evaluation = retrieval_qa_synthetic("train", 0), retrieval_qa_synthetic("eval", 0)
    assert len(train) + len(evaluation) == 120 and not {q["id"] for q in train} & {q["id"] for q in evaluation}
    assert len(synthetic_world(0, 2000)["persons"]) == 2000                   # large worlds finish (unique names)


def test_bm25_finds_the_first_hop_of_synthetic_questions():
    questions = synthetic_questions(0, 60)
    found = [q["supporting"][0] in [p["id"] for p in bm25_search(q["question"], k=3)] for q in questions]
    assert sum(found) / len(found) >= 0.9
    hit = bm25_search(questions[0]["question"], k=2)[0]
    assert set(hit) == {"id", "title", "text", "score"} and hit["score"] > 0
    assert bm25_search("?? !", k=3) == [] and bm25_search("zzzz qqqq", k=3) == []
    with pytest.raises(RetrievalError, match="k must be"):
        bm25_search("city", k=0)


def test_bm25_over_a_jsonl_corpus_is_indexed_once(tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("\n".join(json.dumps(row) for row in [
        {"id": "a", "title": "Ada", "text": "Ada Lovelace wrote the first program."},
        {"id": "b", "title": "Tea", "text": "Green tea comes from China."}]) + "\n")
    assert [p["id"] for p in bm25_search("first program", k=3, corpus=str(corpus))] == ["a"]
    from unimas_plugins import retrievers
    cached = len(retrievers._INDEXES)
    bm25_search("tea", corpus=str(corpus))
    assert len(retrievers._INDEXES) == cached                                  # same file: same index
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": 1, "title": "x"}\n')
    with pytest.raises(RetrievalError, match="line 1 must be an object with a string 'text'"):
        bm25_search("x", corpus=str(bad))
    with pytest.raises(RetrievalError, match="not found"):
        bm25_search("x", corpus=str(tmp_path / "missing.jsonl"))


def test_format_passages_selects_and_cuts_to_fit():
    passages = [{"id": str(i), "title": f"T{i}", "text": "word " * 100} for i in range(3)]
    text = format_passages(passages, max_chars=300)
    assert text.count("\n") == 2 and len(text) <= 300 + 2 and text.startswith("[1] T0: word")
    assert format_passages(passages, selection="I pick 3 and 1, not 9", max_chars=300).startswith("[1] ")
    assert [line[:3] for line in format_passages(passages, selection="3, 1").splitlines()] == ["[1]", "[3]"]
    assert format_passages(passages, selection="none of them").count("\n") == 2   # nothing valid: keep all
    assert format_passages(None) == format_passages([]) == "(no passages)"


# -- HTTP retriever against a loopback server -------------------------------------------------------

class _Handler(BaseHTTPRequestHandler):
    calls: ClassVar[dict[str, int]] = {}

    def log_message(self, *args):
        pass

    def _reply(self, code: int, body: bytes):
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        count = self.calls[self.path] = self.calls.get(self.path, 0) + 1
        ok = json.dumps({"results": [{"id": f"d{i}", "title": "T", "text": f"{request['query']} {i}", "score": 1.0}
                                     for i in range(10)]}).encode()
        if self.path == "/search":
            self._reply(200, ok)
        elif self.path == "/slow":
            time.sleep(1.0)
            self._reply(200, ok)
        elif self.path == "/flaky":
            self._reply(503, b"{}") if count <= 2 else self._reply(200, ok)
        elif self.path == "/broken":
            self._reply(500, b"{}")
        elif self.path == "/malformed":
            self._reply(200, b'{"results": [')
        elif self.path == "/shape":
            self._reply(200, b'{"hits": 3}')
        else:
            self._reply(404, b"{}")


@pytest.fixture(scope="module")
def server():
    """A retrieval server on 127.0.0.1 (a free port); stopped when the module's tests end."""
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()
    thread.join(5)


def search(url, **kwargs):
    return asyncio.run(http_search("who wrote it", k=2, url=url, **kwargs))


def test_http_search_success(server):
    assert search(f"{server}/search") == [{"id": "d0", "title": "T", "text": "who wrote it 0", "score": 1.0},
                                          {"id": "d1", "title": "T", "text": "who wrote it 1", "score": 1.0}]


def test_http_search_retries_with_backoff_until_the_server_recovers(server):
    started = time.perf_counter()
    assert len(search(f"{server}/flaky", retries=2, backoff_s=0.05)) == 2
    assert _Handler.calls["/flaky"] == 3 and time.perf_counter() - started >= 0.05 + 0.1


def test_http_search_errors_say_what_happened(server):
    with pytest.raises(RetrievalError, match=r"failed after 1 attempt\(s\): timed out after 0.2 s"):
        search(f"{server}/slow", timeout_s=0.2, retries=0)
    with pytest.raises(RetrievalError, match=r"failed after 3 attempt\(s\): HTTP 500 .*HTTP 500 .*HTTP 500"):
        search(f"{server}/broken", retries=2, backoff_s=0.01)
    with pytest.raises(RetrievalError, match="answered HTTP 404"):
        search(f"{server}/missing", retries=3)
    assert _Handler.calls["/missing"] == 1                                      # a 4xx is not retried
    with pytest.raises(RetrievalError, match="malformed JSON"):
        search(f"{server}/malformed")
    with pytest.raises(RetrievalError, match="expected a list of passages"):
        search(f"{server}/shape")
    with pytest.raises(RetrievalError, match="connection failed"):
        search("http://127.0.0.1:9/search", retries=0)                        # nothing listens on port 9
    with pytest.raises(RetrievalError, match="http:// or https://"):
        search("file:///etc/passwd")


# -- example configs: validate and train ------------------------------------------------------------

def _model_path(chat_model):
    return ["--set", f"models.team.options.path={chat_model}"]


@pytest.mark.parametrize("name", EXAMPLES)
def test_example_validates(name, chat_model, repo):
    assert main(["validate", str(repo / "examples" / name), *_model_path(chat_model), "--episodes", "2"]) == 0


def _check_run(run, config_path, tools):
    config = yaml.safe_load(config_path.read_text())
    trajectories = read_jsonl(run / "trajectories" / "train.jsonl")
    assert trajectories and not any(t.failed for t in trajectories)
    roles = {t.role for tr in trajectories for t in tr.turns()}
    assert roles == set(config["roles"])
    assert {c.tool for tr in trajectories for c in tr.tool_calls()} == tools
    for trajectory in trajectories:
        assert all(turn.reward is not None and turn.advantage is not None for turn in trajectory.turns())
        for entry in config["rewards"]:
            value = trajectory.rewards[entry["name"]]
            if entry["level"] == "trajectory":
                assert isinstance(value, float)
            else:
                wanted = {t.id for t in trajectory.turns() if t.role in entry.get("roles", config["roles"])}
                assert isinstance(value, dict) and set(value) == wanted
    return trajectories


@pytest.mark.parametrize(("name", "tools"), [("retrieval_qa_cpu.yaml", {"bm25_search"}),
                                             ("retrieval_qa_graph_cpu.yaml", {"bm25_search", "format_passages"}),
                                             ("retrieval_qa_real_model.yaml", {"bm25_search"})])
def test_example_trains_two_steps_on_the_cpu(name, tools, chat_model, repo, tmp_path):
    path = repo / "examples" / name
    assert main(["train", str(path), "--run-dir", str(tmp_path / "run"), *_model_path(chat_model), *SHORT]) == 0
    _check_run(tmp_path / "run", path, tools)


def test_a_failing_retrieval_server_is_recorded_and_the_episodes_go_on(chat_model, repo, server, tmp_path):
    path = repo / "examples" / "retrieval_qa_cpu.yaml"
    overrides = ["--set", "workflow.params.retriever=http_search",
                 "--set", f"workflow.params.retriever_args={{url: '{server}/broken', retries: 1, backoff_s: 0.01}}"]
    assert main(["train", str(path), "--run-dir", str(tmp_path / "run"), *_model_path(chat_model),
                 *SHORT, *overrides]) == 0
    trajectories = _check_run(tmp_path / "run", path, {"http_search"})
    for trajectory in trajectories:
        calls = trajectory.tool_calls()
        assert calls and all(isinstance(c, ToolNode) and c.result is None for c in calls)
        assert all(c.error.startswith("RetrievalError: POST ") and "HTTP 500" in c.error for c in calls)
        assert trajectory.outcome["retrieval_errors"] == [c.error for c in calls]
        assert all("(no passages)" in t.input for t in trajectory.turns("answerer"))
