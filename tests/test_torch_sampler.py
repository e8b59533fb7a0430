"""A torch group's sampling engines (``models.<g>.options.sampler``, :mod:`unimas.groups.torch.sampler`).

The option selects one of three engines, and configs written before it keep
the engine they had (``rollout_process``, ``max_staleness``). The two
in-process engines sample the same tokens from the same weights and stream;
a copy samples the weights it was last given until the next publish, and
reports the version it sampled with.
"""

from __future__ import annotations

import typing

import pytest
import torch
from pydantic import ValidationError

from tests.test_torch_backend import ALPHABET, PROMPTS, gen, group_spec, turns_from
from unimas.config.schema import ModelGroupConfig, OptimConfig
from unimas.groups.base import GenRequest
from unimas.groups.torch import TorchModelGroup, TorchOptions
from unimas.groups.torch.options import SamplerKind
from unimas.groups.torch.sampler import ENGINES, CopySampler, InPlaceSampler

TINY = {"alphabet": ALPHABET, "hidden_size": 32, "num_layers": 2, "num_heads": 4, "max_positions": 64}


def make_group(sampler: str | None, seed: int = 0, **algorithm) -> TorchModelGroup:
    options = {"tiny": TINY, **({} if sampler is None else {"sampler": sampler})}
    config = ModelGroupConfig(options=options, optim=OptimConfig(lr=1e-2))
    return TorchModelGroup.build(group_spec(config, seed=seed, **algorithm))


def requests() -> list[GenRequest]:
    return [GenRequest(prompt=p, generation=gen(5)) for p in PROMPTS]


def test_every_option_value_has_an_engine():
    assert sorted(ENGINES) == sorted(typing.get_args(SamplerKind))


@pytest.mark.parametrize("options, staleness, kind", [
    ({}, 0, "inplace"),
    ({}, 2, "copy"),
    ({"rollout_process": True}, 0, "replica"),
    ({"rollout_process": True}, 1, "replica"),
    ({"sampler": "copy"}, 0, "copy"),
    ({"sampler": "inplace"}, 3, "inplace"),
    ({"sampler": "replica", "rollout_process": True}, 0, "replica"),
])
def test_configs_written_before_the_option_keep_their_engine(options, staleness, kind):
    assert TorchOptions.model_validate({"tiny": TINY, **options}).sampler_kind(staleness) == kind


def test_two_engines_at_once_is_an_error_naming_both_keys():
    with pytest.raises(ValidationError, match="rollout_process.*sampler is 'copy'"):
        TorchOptions.model_validate({"tiny": TINY, "rollout_process": True, "sampler": "copy"})
    with pytest.raises(ValidationError, match="sampler"):
        TorchOptions.model_validate({"tiny": TINY, "sampler": "vllm-somewhere"})


def test_the_group_builds_the_engine_the_options_select():
    assert type(make_group(None).sampler) is InPlaceSampler
    assert type(make_group(None, max_staleness=1).sampler) is CopySampler
    assert type(make_group("copy").sampler) is CopySampler


def test_a_copy_samples_the_published_weights_and_reports_their_version():
    """Same seed: in place and a copy sample the same tokens before an update and after it (the copy gets the
    new weights with the new version); versions count updates."""
    here, copied = make_group("inplace"), make_group("copy")
    first = [r.response_ids for r in here.generate(requests())]
    assert [r.response_ids for r in copied.generate(requests())] == first
    for group in (here, copied):
        turns = turns_from(group.generate(requests()), advantage=1.0)
        group.update(turns)
    after_here, after_copy = here.generate(requests()), copied.generate(requests())
    assert [r.response_ids for r in after_copy] == [r.response_ids for r in after_here]
    assert {r.weight_version for r in after_copy} == {r.weight_version for r in after_here} == {1}


def test_a_copy_keeps_sampling_the_old_weights_until_they_are_published():
    group = make_group("copy")
    group.update(turns_from(group.generate(requests()), advantage=1.0))
    assert all(torch.equal(a, b) for a, b in zip(group.sampler.model.parameters(), group.policy.model.parameters()))
    assert group.sampler.version == group.weight_version == 1
    with torch.no_grad():  # trained weights that were not published yet
        for p in group.policy.model.parameters():
            p.add_(1.0)
    assert not any(torch.equal(a, b) for a, b in zip(group.sampler.model.parameters(), group.policy.model.parameters()))
