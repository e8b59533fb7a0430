import json
from dataclasses import dataclass

import networkx as nx

from unimas.trajectory import GraphTrajectory, ToolNode, TurnNode, read_jsonl, write_jsonl


def sample():
    traj = GraphTrajectory(episode_id="e0", task_id="t0", task={"q": "1+1="}, outcome={"answer": "2"})
    traj.add_node(TurnNode(id="solver#0", role="solver", model_group="m", prompt="1+1=", text="2",
                           prompt_ids=[1, 2, 3], response_ids=[4, 5], logprobs=[-0.1, -0.2], reward=1.0,
                           advantage=0.5))
    traj.add_node(ToolNode(id="tool:calc#0", tool="calc", arguments={"e": "1+1"}, result=2), ["solver#0"])
    traj.add_node(TurnNode(id="verifier#0", role="verifier", model_group="m", prompt="p", text="2",
                           parse_error=None), ["solver#0", "tool:calc#0"])
    traj.rewards = {"exact_match": 1.0, "fix": {"verifier": 0.0}}
    return traj


def test_json_round_trip_is_lossless(tmp_path):
    traj = sample()
    again = GraphTrajectory.from_json(traj.to_json())
    assert again.to_dict() == traj.to_dict()
    assert isinstance(again.node("tool:calc#0"), ToolNode)
    write_jsonl(tmp_path / "t.jsonl", [traj, traj])
    assert [t.to_dict() for t in read_jsonl(tmp_path / "t.jsonl")] == [traj.to_dict()] * 2


@dataclass
class Verdict:
    ok: bool
    why: list


def test_json_line_is_the_deep_copys_text():
    """to_json skips to_dict's deep copy; its text must not change (a dataclass parse result, messages,
    a set that JSON cannot hold)."""
    traj = sample()
    traj.node("verifier#0").parsed = Verdict(True, [Verdict(False, ["x"])])
    traj.node("verifier#0").messages = [{"role": "user", "content": "p"}]
    traj.node("tool:calc#0").result = {"odd": {3}}
    assert traj.to_json() == json.dumps(traj.to_dict(), separators=(",", ":"), default=str)
    assert json.loads(traj.to_json())["nodes"][2]["parsed"] == {"ok": True, "why": [{"ok": False, "why": ["x"]}]}


def test_graph_is_a_dag_with_consumed_edges():
    traj = sample()
    assert nx.is_directed_acyclic_graph(traj.graph)
    assert set(traj.graph.predecessors("verifier#0")) == {"solver#0", "tool:calc#0"}
    assert [t.id for t in traj.turns()] == ["solver#0", "verifier#0"]
    assert [t.id for t in traj.turns("verifier")] == ["verifier#0"]


def test_unknown_consumed_node_is_rejected():
    traj = GraphTrajectory(episode_id="e", task_id="t")
    try:
        traj.add_node(TurnNode(id="a#0", role="a", model_group="m", prompt=""), ["ghost"])
    except KeyError as exc:
        assert "ghost" in str(exc)
    else:
        raise AssertionError("expected KeyError")


def test_json_edges_are_the_graphs_without_building_it():
    """to_json lists edges as networkx does (by source in node order, each once) without building the graph:
    consumed out of node order and twice must still come out in the graph's order."""
    def episode():
        traj = GraphTrajectory(episode_id="e", task_id="t")
        for node, consumed in (("a#0", []), ("b#0", ["a#0"]), ("c#0", ["b#0", "a#0", "b#0"]), ("d#0", ["c#0", "a#0"])):
            traj.add_node(TurnNode(id=node, role=node[0], model_group="m", prompt=""), consumed)
        return traj

    unbuilt = episode()
    line = unbuilt.to_json()
    assert unbuilt._graph is None
    built = episode()
    expected = [[a, b] for a, b in built.graph.edges]
    assert json.loads(line)["edges"] == expected == json.loads(built.to_json())["edges"]
    assert expected == [["a#0", "b#0"], ["a#0", "c#0"], ["a#0", "d#0"], ["b#0", "c#0"], ["c#0", "d#0"]]


def test_an_integer_too_long_to_print_is_noted_not_a_failed_write(tmp_path):
    """A workflow or tool may return an integer past Python's int-to-str digit limit; the episode's line is
    still written, with the number replaced by a note of its size, and everything else kept."""
    huge = 7 ** 20_000  # 56,150 bits: str() refuses it
    traj = sample()
    traj.outcome = {"answer": huge, "nested": [{huge: Verdict(True, [huge])}], "fine": 12}
    traj.node("tool:calc#0").result = huge
    write_jsonl(tmp_path / "t.jsonl", [traj])
    again = read_jsonl(tmp_path / "t.jsonl")[0]
    note = f"<an integer of {huge.bit_length()} bits>"
    assert again.outcome == {"answer": note, "nested": [{note: {"ok": True, "why": [note]}}], "fine": 12}
    assert again.node("tool:calc#0").result == note
    assert again.node("solver#0").response_ids == [4, 5]


def test_a_cycle_or_deep_nesting_in_user_values_is_noted_not_a_failed_write(tmp_path):
    """``json.dumps`` raises on a container that holds itself and recurses past the interpreter's limit on deep
    nesting; both come from a workflow's outcome or a tool's result, and the step must still write the line."""
    traj = sample()
    looped: dict = {"name": "loop"}
    looped["self"] = looped
    deep: list = []
    for _ in range(50_000):
        deep = [deep]
    shared = [1, 2]
    traj.outcome = {"looped": looped, "deep": deep, "twice": [shared, shared]}
    write_jsonl(tmp_path / "t.jsonl", [traj])
    outcome = read_jsonl(tmp_path / "t.jsonl")[0].outcome
    assert outcome["looped"] == {"name": "loop", "self": "<a cycle: this container holds itself>"}
    assert outcome["twice"] == [[1, 2], [1, 2]]  # shared, not a cycle
    level, kept = outcome["deep"], 0
    while isinstance(level, list):
        level, kept = level[0], kept + 1
    assert level == "<nested deeper than 200 levels>" and 190 <= kept <= 200
