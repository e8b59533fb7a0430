"""A verl LoRA group whose rollout is served (server mode) or whose engine runs on two Ray ranks (``workers: ray``).

Both sync base and adapter under their peft names to unimas's ``hf`` servers,
which wrap their model the same way. Checks what a broken wiring gets wrong:
after a balanced update the served group and the two-rank group score tokens as
the in-process LoRA group does (an unseeded adapter init on the ranks, a merged
or bfloat16 export, or a lost adapter tensor would each show), and every sync
check holds.
"""

from __future__ import annotations

import pytest
import ray

from unimas.config.loading import config_from_dict
from unimas.config.schema import GenerationConfig
from unimas.contract.registry import build_registry
from unimas.groups.base import GenRequest, TrainTurn
from unimas.runtime.build import build_group

TINY = {"architecture": "qwen2", "alphabet": "SL:abcdefgh", "hidden_size": 32, "num_layers": 2, "num_heads": 4,
        "max_positions": 32}
LORA = {"r": 4, "alpha": 8.0, "target_modules": ["q_proj", "v_proj"]}
FIXED = [TrainTurn([4, 6, 7], [8, 9, 10], [], 0.0, temperature=0.7), TrainTurn([5, 6], [11, 1], [], 0.0)]
EVEN = [TrainTurn([4 + i, 6], [8 + i, 9], [], 1.0 if i % 2 else -1.0) for i in range(4)]


def tree(group_name: str, **options) -> dict:
    group = {"backend": "verl", "options": {"tiny": dict(TINY), **options}, "optim": {"lr": 0.05},
             "lora": dict(LORA)}
    role = {"model": group_name, "adapter": "shared", "generation": {"max_new_tokens": 1, "require_eos": False}}
    return {
        "name": "verl_lora_served", "models": {group_name: group},
        "roles": {"speaker": {**role, "template": "S:{target}"}, "listener": {**role, "template": "L:{message}"}},
        "workflow": {"name": "signalling"}, "data": {"name": "signalling", "params": {"targets": "abcdefgh"}},
        "rewards": [{"name": "exact_match", "level": "trajectory"}],
        "algorithm": {"estimator": "grpo", "group_size": 4}, "trainer": {"steps": 10, "seed": 3},
    }


def gap(x, y):
    return max(abs(p - q) for a, b in zip(x, y) for p, q in zip(a, b))


def trained_scores(registry, **options):
    """Build the group (one name, so one seed for weights and adapter init), update it once, score, close it."""
    group = build_group(config_from_dict(tree("team", **options)), registry, "team")
    try:
        initial = group.trainer_logprobs(FIXED)
        group.update(EVEN)
        assert group.last_sync_diff is not None and group.last_sync_diff <= 1e-5
        assert group.rollout.weight_version == 1
        scores = group.trainer_logprobs(FIXED)
        served = (group.rollout.logprobs_per_server([t.prompt_ids for t in FIXED], [t.response_ids for t in FIXED],
                                                    [0.7, 1.0]) if hasattr(group.rollout, "logprobs_per_server")
                  else [])
        gen = GenerationConfig(max_new_tokens=2, temperature=1.0, require_eos=False)
        [result] = group.generate([GenRequest(prompt="S:a", generation=gen, adapter="shared")])
        assert result.response_ids and result.weight_version == 1
        return initial, scores, served
    finally:
        group.close()


@pytest.mark.slow
def test_served_and_ranked_lora_groups_train_as_the_in_process_one():
    registry = build_registry()
    ray_before = ray.is_initialized()
    try:
        initial, expected, _ = trained_scores(registry)
        assert gap(expected, initial) > 1e-3  # the adapter moved
        _, scores, served = trained_scores(registry, rollout_server=True)
        assert gap(scores, expected) < 1e-6 and gap(served[0], expected) < 1e-5
        _, scores, served = trained_scores(registry, workers="ray", world_size=2)
        assert gap(scores, expected) < 1e-4
        assert len(served) == 2 and all(gap(answer, expected) < 1e-4 for answer in served)
    finally:
        if not ray_before:
            ray.shutdown()
