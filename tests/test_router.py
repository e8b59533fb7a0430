import asyncio

from unimas.config.schema import GenerationConfig
from unimas.controller.router import Router
from unimas.errors import ModelGroupError
from unimas.groups.base import GenRequest, GenResult


class EchoTransport:
    """Zero-latency stand-in for a model group: a router fixture, not a backend."""

    def __init__(self, fail_group=None):
        self.calls = []
        self.fail_group = fail_group

    async def generate(self, group, requests):
        self.calls.append((group, len(requests)))
        if group == self.fail_group:
            raise RuntimeError("actor died")
        return [GenResult(text=r.prompt.upper(), prompt_ids=[], response_ids=[1], logprobs=[0.0], finished=True)
                for r in requests]


def episode(router, group, turns, prompt):
    """Register the episode as live now (as the controller does), then run it."""
    router.episode_started()
    return _episode(router, group, turns, prompt)


async def _episode(router, group, turns, prompt):
    try:
        out = []
        for i in range(turns):
            request = GenRequest(prompt=f"{prompt}{i}", generation=GenerationConfig())
            result = await router.submit(group, request, episode=prompt)
            out.append(result.text)
        return out
    finally:
        router.episode_finished()


def test_requests_from_all_live_episodes_form_one_batch_per_group():
    transport = EchoTransport()
    router = Router(transport, max_batch_size=256, max_wait_s=10.0)

    async def main():
        jobs = [episode(router, "a" if i % 2 else "b", 3, f"e{i}-") for i in range(64)]
        return await asyncio.gather(*jobs)

    results = asyncio.run(main())
    assert results[1] == ["E1-0", "E1-1", "E1-2"]
    # 3 rounds x 2 groups, each with all 32 episodes of that group: no waiting on the 10 s timer
    assert sorted(transport.calls) == sorted([("a", 32), ("b", 32)] * 3)


def test_max_batch_size_splits_batches():
    transport = EchoTransport()
    router = Router(transport, max_batch_size=10, max_wait_s=10.0)

    async def main():
        return await asyncio.gather(*[episode(router, "a", 1, f"e{i}") for i in range(25)])

    asyncio.run(main())
    assert [n for _, n in transport.calls] == [10, 10, 5]


def test_a_slow_episode_does_not_block_the_others():
    transport = EchoTransport()
    router = Router(transport, max_batch_size=256, max_wait_s=0.001)
    finished = []

    async def slow():
        try:
            await asyncio.sleep(0.5)  # e.g. a slow tool call
        finally:
            router.episode_finished()

    async def fast(i):
        await episode(router, "a", 2, f"f{i}")
        finished.append(asyncio.get_running_loop().time())

    async def main():
        start = asyncio.get_running_loop().time()
        router.episode_started()
        await asyncio.gather(slow(), *[fast(i) for i in range(4)])
        return start

    start = asyncio.run(main())
    assert max(finished) - start < 0.4


def test_group_failure_reaches_every_waiting_episode_with_the_group_name():
    router = Router(EchoTransport(fail_group="b"), max_batch_size=256, max_wait_s=10.0)

    async def main():
        return await asyncio.gather(episode(router, "b", 1, "x"), episode(router, "b", 1, "y"),
                                    return_exceptions=True)

    results = asyncio.run(main())
    assert all(isinstance(r, ModelGroupError) and r.group == "b" and r.phase == "generate" for r in results)
    assert "actor died" in str(results[0])


def test_a_progress_callback_stays_in_its_process():
    """A streamed request's callback (a closure over the server's loop) is dropped when the request is pickled
    for a Ray actor, which then answers in one piece; the rest of the request travels unchanged."""
    import pickle

    request = GenRequest(prompt="p", generation=GenerationConfig(), stop=["x"], progress=lambda text: None)
    travelled = pickle.loads(pickle.dumps(request))
    assert travelled.progress is None and request.progress is not None
    assert (travelled.prompt, travelled.stop, travelled.generation) == ("p", ["x"], request.generation)
