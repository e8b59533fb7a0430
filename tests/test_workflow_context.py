"""Python workflows through the real router: parallel roles, tools, failures, edges."""

import asyncio

import networkx as nx

from tests.test_router import EchoTransport
from unimas.config.schema import RoleConfig
from unimas.controller.episodes import Controller
from unimas.controller.router import Router
from unimas.controller.specs import EpisodeSpec

ROLES = {
    "pro": RoleConfig(model="a", template="P:{question}"),
    "con": RoleConfig(model="b", template="C:{question}"),
    "judge": RoleConfig(model="a", template="J:{pro}|{con}|{total}"),
}


def add(x, y):
    return x + y


async def debate(ctx, task):
    pro, con = await asyncio.gather(ctx.act("pro"), ctx.act("con"))
    total = await ctx.tool("add", after=[pro, con], x=len(pro.text), y=len(con.text))
    verdict = await ctx.act("judge", pro=pro, con=con, total=total)
    if task.get("explode"):
        raise RuntimeError("workflow bug")
    return {"answer": verdict.text}


def run(specs, transport):
    router = Router(transport, max_batch_size=64, max_wait_s=10.0)
    return asyncio.run(Controller(debate, ROLES, router, {"add": add}).run(specs)), router


def test_parallel_roles_tools_and_consumed_edges():
    specs = [EpisodeSpec(f"e{i}", "t0", {"question": "q?"}) for i in range(4)]
    transport = EchoTransport()
    trajectories, router = run(specs, transport)
    traj = trajectories[0]
    assert traj.outcome == {"answer": "J:P:Q?|C:Q?|8"}
    assert set(traj.graph.edges) == {("pro#0", "tool:add#0"), ("con#0", "tool:add#0"), ("pro#0", "judge#0"),
                                     ("con#0", "judge#0"), ("tool:add#0", "judge#0")}
    assert nx.is_directed_acyclic_graph(traj.graph)
    # pro and con of all 4 episodes are generated together: one batch per group, then the judges in one batch
    assert sorted(transport.calls) == [("a", 4), ("a", 4), ("b", 4)]


def test_a_failing_episode_is_isolated_and_recorded():
    specs = [EpisodeSpec("ok", "t0", {"question": "q"}), EpisodeSpec("bad", "t0", {"question": "q", "explode": 1})]
    trajectories, _ = run(specs, EchoTransport())
    assert trajectories[0].error is None and trajectories[0].outcome["answer"]
    assert trajectories[1].error.startswith("RuntimeError: workflow bug (at ")
    assert "test_workflow_context.py:" in trajectories[1].error  # the user's file and line
    assert [t.id for t in trajectories[1].turns()] == ["pro#0", "con#0", "judge#0"]


def test_failing_tool_is_data_not_a_crash():
    async def flaky(ctx, task):
        node = await ctx.tool("add", x=1, y="a")
        return {"error": node.error}

    router = Router(EchoTransport(), max_batch_size=8, max_wait_s=10.0)
    [traj] = asyncio.run(Controller(flaky, ROLES, router, {"add": add}).run([EpisodeSpec("e", "t", {})]))
    assert traj.error is None and traj.outcome["error"].startswith("TypeError")
