"""``unimas plugins`` lists every name a config may use, verl's own estimators and policy losses included."""

from __future__ import annotations

import re

import pytest

from unimas.cli import main


def _section(out: str, kind: str) -> str:
    return re.search(rf"^{kind}:\n((?:  .*\n)+)", out, re.MULTILINE).group(1)


@pytest.mark.parametrize("verbose", [False, True], ids=["plain", "verbose"])
def test_the_built_in_verl_algorithms_are_listed(capsys, verbose):
    assert main(["plugins", *(["--verbose"] if verbose else [])]) == 0
    out = capsys.readouterr().out
    estimators, losses = _section(out, "estimators"), _section(out, "policy_losses")
    verl_estimators = next(line for line in estimators.splitlines() if line.endswith("(verl)"))
    verl_losses = next(line for line in losses.splitlines() if line.endswith("(verl)"))
    assert {"grpo", "gae", "rloo"} <= set(verl_estimators.strip().removesuffix("(verl)").strip().split(", "))
    assert "vanilla" in verl_losses.strip().removesuffix("(verl)").strip().split(", ")
    assert "passthrough" in estimators and "m2po" in losses  # the plugins' names stay listed beside them
