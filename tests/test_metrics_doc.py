"""docs/metrics.md documents exactly the metric names a real run writes."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

from unimas.algorithms.credit import reward_keys
from unimas.config.loading import load_config
from unimas.output.metrics import read_metrics

DOC = Path(__file__).resolve().parents[1] / "docs" / "metrics.md"
ROW = re.compile(r"^\| `([^`]+)` \| (.+) \| (.+) \|$")


def documented() -> dict[str, str]:
    """Metric name (with placeholders) -> its "when logged" cell."""
    rows = {}
    for line in DOC.read_text().splitlines():
        match = ROW.match(line)
        if match:
            assert match.group(1) not in rows, f"{match.group(1)} is documented twice"
            rows[match.group(1)] = match.group(3)
    return rows


def expand(name: str, values: dict[str, list[str]]) -> set[str]:
    """Every concrete name a documented name stands for in a given config."""
    slots = re.findall(r"<(\w+)>", name)
    names = set()
    for combo in itertools.product(*(values[s] for s in slots)):
        concrete = name
        for slot, value in zip(slots, combo):
            concrete = concrete.replace(f"<{slot}>", value, 1)
        names.add(concrete)
    return names


def test_documented_metric_names_match_a_real_run(real_run):
    config = load_config(real_run / "config.yaml")
    values = {"role": list(config.roles), "group": list(config.models), "reward": reward_keys(config.rewards),
              "k": [str(config.trainer.eval_samples)], "metric": [],
              "adapter": sorted({role.adapter for role in config.roles.values() if role.adapter})}
    rows = documented()
    assert len(rows) > 30, "the metrics table was not found"
    names = {concrete: when for name, when in rows.items() for concrete in expand(name, values)}
    written = {key for record in read_metrics(real_run / "metrics.jsonl") for key in record}

    assert sorted(written - set(names)) == [], "written but not documented in docs/metrics.md"
    expected = {name for name, when in names.items() if "only when" not in when}
    assert sorted(expected - written) == [], "documented but not written by the run"
