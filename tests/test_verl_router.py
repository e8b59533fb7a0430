"""The request router of a served verl group (unimas/groups/verl/balancer.py), as verl's client drives it."""

from __future__ import annotations

import pytest

from unimas.groups.verl.balancer import RequestRouter


def test_least_in_flight_first_registered_on_a_tie_and_released_counts_return():
    router = RequestRouter({"s0": "handle0", "s1": "handle1"})
    assert router.acquire_server("a") == ("s0", "handle0")
    assert router.acquire_server("b") == ("s1", "handle1")
    assert router.acquire_server("c") == ("s0", "handle0")
    router.release_server("s0")
    router.release_server("s0")
    assert router.in_flight() == {"s0": 0, "s1": 1}
    assert router.acquire_server("d") == ("s0", "handle0")
    router.release_server("s0")
    router.release_server("s0")  # a release too many never makes a count negative
    router.release_server("gone")  # nor does a server the router never had raise
    assert router.in_flight() == {"s0": 0, "s1": 1}


def test_a_request_id_seen_before_keeps_its_server_until_forgotten():
    router = RequestRouter({"s0": 0, "s1": 1}, remember=2)
    assert router.acquire_server("chat")[0] == "s0"  # s0 now busier than s1
    assert router.acquire_server("chat")[0] == "s0"  # sticky, although s1 has fewer in flight
    router.acquire_server("x")
    router.acquire_server("y")  # both to s1; two newer ids: "chat", the least recently used, is forgotten
    for server in ("s0", "s0", "s1", "s1"):
        router.release_server(server)
    assert router.in_flight() == {"s0": 0, "s1": 0}
    router.acquire_server("busy")  # s0
    assert router.acquire_server("chat")[0] == "s1"  # routed afresh: least in flight


def test_a_router_without_servers_is_refused():
    with pytest.raises(ValueError, match="at least one server"):
        RequestRouter({})
