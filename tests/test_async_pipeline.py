"""The asynchronous pipeline: max_staleness 0 is the recorded synchronous loop, bit for bit; above 0 rollouts
run ahead of updates within the bound, stale turns are dropped or re-weighted, and a resume is lossless."""

from __future__ import annotations

import json

import pytest

from tests.async_golden import CONFIGS, GOLDEN, run

NEW_KEYS = ("/staleness_mean", "/staleness_max", "/stale_dropped", "/weight_version", "/stale_turns",
            "/importance_weight")
"""Metrics added with the pipeline (the recorded run predates them)."""


@pytest.mark.parametrize("config", CONFIGS)
def test_max_staleness_0_reproduces_the_recorded_synchronous_run(tmp_path, config):
    recorded = json.loads(GOLDEN.read_text())[config]
    records = run(config, tmp_path / "run", ["algorithm.max_staleness=0"])
    assert len(records) == len(recorded)
    for now, then in zip(records, recorded):
        assert {k: now[k] for k in then} == then
        added = set(now) - set(then)
        assert all(k.endswith(NEW_KEYS) for k in added), sorted(added)
        assert all(now[k] == 0 for k in added if k.endswith(("/staleness_max", "/stale_dropped", "/stale_turns")))
    versions = [r["group/listener_model/weight_version"] for r in records if "group/listener_model/weight_version" in r] \
        if "separate" in config else [r["group/shared/weight_version"] for r in records if r["step"] > 0]
    assert versions == [1.0, 2.0, 3.0]
