import pytest

from tests.conftest import EXAMPLES
from unimas.config.loading import apply_override, config_from_dict, load_config
from unimas.errors import UserError


def minimal(**changes):
    tree = {
        "models": {"m": {"options": {"tiny": {"alphabet": "ab"}}}},
        "roles": {"r": {"model": "m", "template": "{x}"}},
        "workflow": {"name": "signalling"},
        "data": {"name": "signalling"},
        "rewards": [{"name": "exact_match"}],
    }
    tree.update(changes)
    return tree


def test_unknown_key_is_an_error_naming_the_path():
    tree = minimal()
    tree["trainer"] = {"stepz": 3}
    with pytest.raises(UserError, match=r"trainer\.stepz: unknown key"):
        config_from_dict(tree)


def test_override_sets_nested_values_with_yaml_types():
    tree = minimal()
    apply_override(tree, "trainer.steps=7")
    apply_override(tree, "algorithm.norm_by_std=false")
    apply_override(tree, "roles.r.generation.temperature=0.5")
    config = config_from_dict(tree)
    assert config.trainer.steps == 7
    assert config.algorithm.norm_by_std is False
    assert config.roles["r"].generation.temperature == 0.5


def test_an_override_ending_in_a_colon_is_text_and_only_flow_collections_are_collections():
    tree = minimal()
    apply_override(tree, "roles.r.template=Answer:")  # YAML alone reads this as the mapping {Answer: None}
    apply_override(tree, "roles.r.system=Role: judge")
    apply_override(tree, "trainer.steps=3")
    config = config_from_dict(tree)
    assert config.roles["r"].template == "Answer:" and config.roles["r"].system == "Role: judge"
    flows = {}
    apply_override(flows, "a=[1, 2]")
    apply_override(flows, "b={x: 1}")
    apply_override(flows, "c=- item")
    assert flows == {"a": [1, 2], "b": {"x": 1}, "c": "- item"}


def test_override_without_equals_is_a_user_error():
    with pytest.raises(UserError, match="--set"):
        apply_override({}, "trainer.steps")


def test_settings_that_moved_under_options_say_where_they_went():
    tree = minimal(models={"m": {"tiny": {"alphabet": "ab"}}})
    with pytest.raises(UserError, match=r"models.m: .*tiny moved under 'options:'"):
        config_from_dict(tree)


def test_per_group_algorithm_overrides_inherit_the_rest():
    tree = minimal(algorithm={"kl_coef": 0.1, "clip_ratio": 0.3},
                   models={"m": {"options": {"tiny": {"alphabet": "ab"}},
                                 "algorithm": {"kl_coef": 0.0, "ppo_epochs": 2}}})
    config = config_from_dict(tree)
    settings = config.algorithm_for("m")
    assert (settings.kl_coef, settings.ppo_epochs, settings.clip_ratio) == (0.0, 2, 0.3)
    assert config.algorithm.kl_coef == 0.1  # the global settings are untouched


def test_stop_when_takes_any_metric_and_stop_at_accuracy_is_its_shorthand():
    config = config_from_dict(minimal(trainer={"stop_when": {"metric": "reward/mean", "at_least": 0.9}}))
    assert config.stop_condition.reached({"reward/mean": 0.95}) and not config.stop_condition.reached({"step": 3})
    low = config_from_dict(minimal(trainer={"stop_when": {"metric": "group/m/kl", "at_most": 0.01}}))
    assert low.stop_condition.reached({"group/m/kl": 0.0}) and not low.stop_condition.reached({"group/m/kl": 0.5})
    short = config_from_dict(minimal(trainer={"stop_at_accuracy": 0.5})).stop_condition
    assert (short.metric, short.at_least) == ("eval/accuracy", 0.5)
    with pytest.raises(UserError, match="exactly one of 'at_least' or 'at_most'"):
        config_from_dict(minimal(trainer={"stop_when": {"metric": "reward/mean"}}))


def test_workflow_name_or_graph_not_both():
    tree = minimal(workflow={})
    with pytest.raises(UserError, match="workflow"):
        config_from_dict(tree)


def test_mapping_expresses_every_sharing_scheme_in_one_run():
    tree = minimal(
        models={
            "shared": {"options": {"tiny": {"alphabet": "ab"}}},
            "solo": {"options": {"tiny": {"alphabet": "ab"}}},
            "base": {"options": {"tiny": {"alphabet": "ab"}}, "lora": {"r": 4}},
            "judge": {"options": {"tiny": {"alphabet": "ab"}}, "trainable": False},
        },
        roles={
            "a": {"model": "shared", "template": "{x}"},
            "b": {"model": "shared", "template": "{x}"},
            "c": {"model": "solo", "template": "{x}"},
            "d": {"model": "base", "adapter": "d", "template": "{x}"},
            "e": {"model": "base", "adapter": "e", "template": "{x}"},
            "f": {"model": "judge", "template": "{x}", "trainable": False},
        },
    )
    config = config_from_dict(tree)
    assert {r.model for r in config.roles.values()} == {"shared", "solo", "base", "judge"}


def test_missing_file_and_bad_yaml_name_the_file(tmp_path):
    with pytest.raises(UserError, match="nope.yaml"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("models: [unclosed")
    with pytest.raises(UserError, match="bad.yaml"):
        load_config(bad)


def test_examples_load():
    for path in sorted(EXAMPLES.glob("*.yaml")):
        load_config(path)
