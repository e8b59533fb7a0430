"""Backend capability flags, checked by ``unimas validate`` before any model loads.

This module is the plugin (the configs list it under ``plugins:``): one
backend per capability flag that lacks only that flag, each the torch
backend otherwise, so a config that needs the capability is refused on it,
naming the field and the backend, and passes on ``torch``, which has it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import pytest

import unimas
from tests.conftest import EXAMPLES, REPO
from unimas.cli import main
from unimas.config.loading import load_config
from unimas.contract.protocols import Backend, capability
from unimas.contract.registry import build_registry
from unimas.groups.openai import OpenAIModelGroup
from unimas.groups.torch.backend import TorchBackend
from unimas.preflight.validate import check_config

PLUGIN = "tests.test_backend_capabilities"
QUICKSTART = EXAMPLES / "quickstart.yaml"
"""One torch group ``shared`` that trains both roles, speaker and listener."""


class GeneratesOnly(TorchBackend):
    can_train = False


class GeneratesOnlyWithoutScoring(TorchBackend):
    can_train = can_score_turns = False


class WithoutCritic(TorchBackend):
    supports_critic = False


class WithoutScoring(TorchBackend):
    can_score_turns = False


class WithoutAdapters(TorchBackend):
    can_host_adapters = False


class WithoutSavedWeights(TorchBackend):
    can_save_weights = False


@unimas.hookimpl
def unimas_backends():
    return {"generates_only": GeneratesOnly, "generates_only_without_scoring": GeneratesOnlyWithoutScoring,
            "without_critic": WithoutCritic, "without_scoring": WithoutScoring,
            "without_adapters": WithoutAdapters, "without_saved_weights": WithoutSavedWeights}


@dataclass(frozen=True)
class Need:
    """A config that needs ``flag``: ``settings`` for ``unimas --set``, with ``{backend}`` for the backend name."""

    flag: str
    backend: str
    """The plugin backend above that lacks ``flag``."""
    settings: tuple[str, ...]
    refused: tuple[tuple[str, str], ...]
    """``(where, part of the message)`` of each problem the flag's check reports on ``backend``."""


SHARED_LORA = ("models.shared.lora={r: 4}", "roles.speaker.adapter=speaker", "roles.listener.adapter=listener")
NEEDS = [
    Need("can_train", "generates_only", ("models.shared.backend={backend}",),
         (("models.shared.trainable", "backend 'generates_only' only generates; set trainable: false"),)),
    Need("supports_critic", "without_critic",
         ("models.shared.backend={backend}", "algorithm.estimator=gae", "models.shared.critic={optim: {lr: 0.001}}"),
         (("models.shared.critic", "backend 'without_critic' has no critic"),)),
    Need("can_score_turns", "without_scoring",
         ("models.shared.backend={backend}",
          "algorithm.update_order={name: reverse_execution, params: {ratio_clip: 0.2}}"),
         (("algorithm.update_order", "backend 'without_scoring' of model group 'shared' cannot score turns"),)),
    Need("can_host_adapters", "without_adapters", ("models.shared.backend={backend}", *SHARED_LORA),
         (("models.shared.lora", "backend 'without_adapters' cannot host LoRA adapters"),
          ("roles.speaker.adapter", "backend 'without_adapters' cannot host LoRA adapters"),
          ("roles.listener.adapter", "backend 'without_adapters' cannot host LoRA adapters"))),
    Need("can_save_weights", "without_saved_weights",
         ("models.shared.backend={backend}",
          "models.opponent={backend: {backend}, trainable: false, snapshot: {of: shared}, "
          "options: {tiny: {architecture: qwen2, alphabet: 'SL:abcdefgh01234567', hidden_size: 64, num_layers: 2, "
          "num_heads: 4, init_std: 0.1, tie_embeddings: false}}}"),
         (("models.opponent.snapshot", "backend 'without_saved_weights' cannot load saved weights"),
          ("models.opponent.snapshot.of", "backend 'without_saved_weights' of model group 'shared' cannot save"))),
]
IDS = [need.flag for need in NEEDS]


def _problems(need: Need, backend: str, *extra: str) -> list[tuple[str, str]]:
    settings = [f"plugins=[{PLUGIN}]", *(s.replace("{backend}", backend) for s in need.settings), *extra]
    config = load_config(QUICKSTART, settings)
    return check_config(config, build_registry(config.plugins))


def _reported(problems: list[tuple[str, str]], where: str, message: str) -> bool:
    return any(found == where and message in text for found, text in problems)


@pytest.mark.parametrize("need", NEEDS, ids=IDS)
def test_a_config_needing_a_capability_the_backend_lacks_is_refused_naming_the_field(need):
    problems = _problems(need, need.backend)
    for where, message in need.refused:
        assert _reported(problems, where, message), problems


@pytest.mark.parametrize("need", NEEDS, ids=IDS)
def test_the_same_config_on_a_backend_with_the_capability_has_no_such_problem(need):
    assert _problems(need, "torch") == []


def test_only_the_lacking_backend_is_refused():
    """Each plugin backend lacks one flag: every other capability's config passes the capability checks on it."""
    for need in NEEDS:
        for other in NEEDS:
            if other is need:
                continue
            problems = _problems(other, need.backend)
            assert not any(_reported(problems, where, message.replace(other.backend, need.backend))
                           for where, message in other.refused), (need.flag, other.flag, problems)


def test_an_update_order_without_ratios_scores_no_turns():
    """``needs_ratios`` is read on the built order: ``reverse_execution`` without ``ratio_clip`` needs none."""
    need = NEEDS[IDS.index("can_score_turns")]
    problems = _problems(need, need.backend, "algorithm.update_order={name: reverse_execution}")
    assert not any(where == "algorithm.update_order" for where, _ in problems), problems


def test_a_group_its_backend_cannot_train_is_refused_for_that_alone():
    """Scoring is asked only of groups that train: a backend that cannot train is not also told it cannot score."""
    need = NEEDS[IDS.index("can_score_turns")]
    problems = _problems(need, "generates_only_without_scoring")
    assert [where for where, _ in problems] == ["models.shared.trainable"], problems


def test_a_critic_is_opt_in_and_the_other_capabilities_opt_out():
    """A plugin backend that declares nothing gets the protocol's defaults."""
    class Bare:
        pass

    assert not capability(Bare, Backend, "supports_critic")
    for flag in ("can_train", "can_score_turns", "can_host_adapters", "can_save_weights"):
        assert capability(Bare, Backend, flag)


@pytest.mark.parametrize("flag", ["can_train", "can_score_turns", "can_host_adapters", "can_save_weights",
                                  "supports_critic"])
def test_the_api_backend_lacks_what_the_torch_backend_has(flag):
    assert capability(TorchBackend, Backend, flag)
    assert not capability(OpenAIModelGroup, Backend, flag)


def test_every_backend_flag_is_in_the_table_of_docs_plugins_md():
    flags = [name for name in Backend.__annotations__ if name != "options"]
    section = (REPO / "docs" / "plugins.md").read_text().split("### `unimas_backends()")[1].split("\n### ")[0]
    rows = re.findall(r"^\| `(\w+)` \| `(True|False)` \|", section, flags=re.MULTILINE)
    assert rows == [(flag, str(getattr(Backend, flag))) for flag in flags]


@pytest.mark.parametrize("need", [NEEDS[IDS.index("can_score_turns")], NEEDS[IDS.index("can_save_weights")]],
                         ids=["can_score_turns", "can_save_weights"])
def test_unimas_validate_exits_2_with_the_message(need, capsys):
    settings = [f"plugins=[{PLUGIN}]", *(s.replace("{backend}", need.backend) for s in need.settings)]
    code = main(["validate", str(QUICKSTART), *[part for s in settings for part in ("--set", s)]])
    err = capsys.readouterr().err
    assert code == 2, err
    lines = [line.strip() for line in err.splitlines()]
    for where, message in need.refused:
        assert any(line.startswith(f"{where}: ") and message in line for line in lines), err
