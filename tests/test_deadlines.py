"""Episode time limits on one shared timer (unimas.controller.timeouts.Deadlines): still per episode."""

import asyncio

import pytest

from unimas.controller.episodes import Controller

from unimas.controller.router import Router
from unimas.controller.specs import EpisodeSpec
from unimas.controller.timeouts import Deadlines


class NoModel:
    async def generate(self, group, requests):
        raise AssertionError("these workflows never call a model")


def run(workflow, episodes, **limits):
    controller = Controller(workflow, {}, Router(NoModel()), {}, **limits)
    specs = [EpisodeSpec(f"e{i}", f"t{i}", {"index": i}) for i in range(episodes)]
    return asyncio.run(controller.run(specs))


def test_each_episode_gets_the_whole_limit_from_its_own_start():
    """One worker runs three 0.15 s episodes back to back under a 0.3 s limit: a step-wide deadline would fail
    the third (0.45 s after the first started); per-episode limits fail none."""

    async def workflow(ctx, task):
        await asyncio.sleep(0.15)
        return {"index": task["index"]}

    trajectories = run(workflow, 3, max_concurrent=1, episode_timeout_s=0.3)
    assert [t.error for t in trajectories] == [None, None, None]
    assert [t.outcome["index"] for t in trajectories] == [0, 1, 2]


def test_only_the_episodes_past_their_limit_fail_and_the_others_keep_their_results():
    async def workflow(ctx, task):
        await asyncio.sleep(10 if task["index"] % 2 else 0.01)
        return {"index": task["index"]}

    trajectories = run(workflow, 4, max_concurrent=2, episode_timeout_s=0.2)
    assert [t.failed for t in trajectories] == [False, True, False, True]
    assert "the episode did not finish within 0.2 s" in trajectories[1].error
    assert trajectories[2].outcome == {"index": 2}


def test_a_cancel_from_elsewhere_stays_a_cancel_and_close_disarms_the_timer():
    async def main():
        deadlines = Deadlines(5.0, "the episode")
        task = asyncio.ensure_future(deadlines.run(asyncio.sleep(10)))
        await asyncio.sleep(0)
        assert deadlines._timer is not None
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        deadlines.close()
        assert deadlines._timer is None

    asyncio.run(main())
