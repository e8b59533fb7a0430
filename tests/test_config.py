import pytest

from unimas.config import apply_override, config_from_dict, load_config
from unimas.errors import UserError
from tests.conftest import EXAMPLES


def minimal(**changes):
    tree = {
        "models": {"m": {"tiny": {"alphabet": "ab"}}},
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


def test_override_without_equals_is_a_user_error():
    with pytest.raises(UserError, match="--set"):
        apply_override({}, "trainer.steps")


def test_model_group_needs_exactly_one_source():
    tree = minimal(models={"m": {"tiny": {"alphabet": "ab"}, "path": "/x"}})
    with pytest.raises(UserError, match="models.m"):
        config_from_dict(tree)


def test_workflow_name_or_graph_not_both():
    tree = minimal(workflow={})
    with pytest.raises(UserError, match="workflow"):
        config_from_dict(tree)


def test_mapping_expresses_every_sharing_scheme_in_one_run():
    tree = minimal(
        models={
            "shared": {"tiny": {"alphabet": "ab"}},
            "solo": {"tiny": {"alphabet": "ab"}},
            "base": {"tiny": {"alphabet": "ab"}, "lora": {"r": 4}},
            "judge": {"tiny": {"alphabet": "ab"}, "trainable": False},
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
