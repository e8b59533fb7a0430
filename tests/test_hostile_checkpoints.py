"""Model dirs, checkpoints and state files built to do harm: each is refused naming the file, in bounded time.

What ``tests/test_checkpoints.py`` and ``tests/test_broken_inputs.py`` leave
out: a ``config.json`` that asks for the dir's own code or describes a model
that cannot be built, weights files that do not hold the model ``config.json``
describes (or hold NaN), tokenizer and manifest JSON that breaks the parser,
a FIFO where a state file or a weights file belongs, and a chat template that
loops for hours or floods its output.
Everything runs on one tiny random-init model dir built once per module.
"""

from __future__ import annotations

import builtins
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import pytest
import torch
from safetensors.torch import load_file, save_file

from unimas.errors import UserError
from unimas.groups.hf import chat, source, tokenizer_files
from unimas.groups.torch import checkpoint
from unimas.groups.torch.options import TorchOptions
from unimas.groups.torch.weights import copy_weights
from unimas.output import checkpoints
from unimas.training.pipeline import PENDING, read_pending


@pytest.fixture(scope="module")
def base_model(tmp_path_factory) -> Path:
    """A tiny Qwen2-style chat model dir (random weights: only loading is tested)."""
    from unimas.testing.tiny_chat import build_chat_model

    return build_chat_model(tmp_path_factory.mktemp("hostile") / "model", instruct_steps=0)


@pytest.fixture
def model_dir(base_model, tmp_path) -> Path:
    return Path(shutil.copytree(base_model, tmp_path / "model"))


def edit_config(directory: Path, **changes: Any) -> None:
    path = directory / "config.json"
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config))


def edit_weights(directory: Path, change: Callable[[dict[str, torch.Tensor]], None]) -> None:
    path = directory / "model.safetensors"
    weights = load_file(path)
    change(weights)
    save_file(weights, path, metadata={"format": "pt"})


def load(directory: Path) -> None:
    source.load_model(TorchOptions(path=str(directory)), "shared", seed=0)


# -- code from the model dir ------------------------------------------------------------------------------------

@pytest.mark.timeout(60)
def test_custom_code_in_a_model_dir_never_runs_even_when_stdin_says_yes(model_dir, tmp_path, monkeypatch):
    """Without ``trust_remote_code=False`` transformers asks "run the custom code? [y/N]" on stdin."""
    marker = tmp_path / "code-ran"
    (model_dir / "custom.py").write_text(f"open({str(marker)!r}, 'w').close()\n"
                                         "from transformers import Qwen2Config as CustomConfig\n"
                                         "from transformers import Qwen2ForCausalLM as CustomModel\n")
    edit_config(model_dir, model_type="custom", auto_map={"AutoConfig": "custom.CustomConfig",
                                                          "AutoModelForCausalLM": "custom.CustomModel"})
    monkeypatch.setattr(builtins, "input", lambda *args: "y")
    with pytest.raises(UserError, match="custom code"):
        load(model_dir)
    assert not marker.exists()


# -- config.json sizes: refused before anything is built ---------------------------------------------------------

@pytest.mark.timeout(60)
@pytest.mark.parametrize(("changes", "message"), [
    ({"hidden_size": -1}, "'hidden_size' is -1: a model size must be a whole number >= 0"),
    ({"vocab_size": float("nan")}, "'vocab_size' is nan"),
    ({"num_attention_heads": 4.0}, "'num_attention_heads' is 4.0"),
    ({"vocab_size": 10**10}, "more than this machine's"),
    ({"num_hidden_layers": 10**6, "layer_types": None}, "more than 10000 blocks"),
])
def test_a_config_of_impossible_sizes_is_refused_naming_it(model_dir, changes, message):
    edit_config(model_dir, **changes)
    with pytest.raises(UserError) as refused:
        load(model_dir)
    assert str(refused.value).startswith(f"{model_dir / 'config.json'}: ") and message in str(refused.value)


@pytest.mark.parametrize(("changes", "message"), [
    ({"rms_norm_eps": "tiny"}, "rms_norm_eps"),
    ({"hidden_size": 128}, "ignore_mismatched_sizes"),  # the weights are 64 wide
], ids=["wrong-type", "other-shapes"])
def test_a_config_that_does_not_fit_its_weights_is_a_user_error(model_dir, changes, message):
    edit_config(model_dir, **changes)
    with pytest.raises(UserError, match=f"cannot load a model from '{model_dir}'.*{message}"):
        load(model_dir)


# -- weights that are not the model config.json describes ---------------------------------------------------------

def drop_last_mlp(weights: dict[str, torch.Tensor]) -> None:
    for name in [name for name in weights if "layers.1.mlp" in name]:
        del weights[name]


def nan_norm(weights: dict[str, torch.Tensor]) -> None:
    weights["model.norm.weight"][:] = float("nan")


@pytest.mark.parametrize(("change", "message"), [
    (drop_last_mlp, "lacks 3 of the weights config.json describes (they would start random)"),
    (lambda weights: weights.update({"model.layers.7.mlp.up_proj.weight": torch.zeros(2)}),
     "holds 1 weights the model of config.json has no place for"),
    (nan_norm, "weight 'model.norm.weight' holds NaN or infinite values"),
])
def test_weights_missing_extra_or_not_finite_are_refused_naming_the_file(model_dir, change, message):
    edit_weights(model_dir, change)
    with pytest.raises(UserError) as refused:
        load(model_dir)
    assert str(refused.value).startswith(f"{model_dir / 'model.safetensors'}: ") and message in str(refused.value)


def test_a_checkpoint_lacking_weights_is_not_resumed_with_random_ones(base_model, model_dir):
    from transformers import AutoModelForCausalLM

    target = AutoModelForCausalLM.from_pretrained(base_model, local_files_only=True)
    edit_weights(model_dir, drop_last_mlp)
    with pytest.raises(UserError, match="lacks 3 of the weights"):
        copy_weights(target, model_dir, clean_names=False, dtype=torch.float32)


# -- JSON that breaks the parser ---------------------------------------------------------------------------------

DEEP = "[" * 100_000 + "]" * 100_000


@pytest.mark.parametrize("text", [
    '{"step": 1e400, "config_sha256": "", "frozen": {}, "mutable": {}, "files": {}}',
    '{"step": 4, "config_sha256": "", "frozen": {}, "mutable": {}, "files": {"a": {"size": 1e400, "sha256": ""}}}',
    DEEP,
])
def test_a_manifest_with_an_infinite_number_or_deep_nesting_is_damage(tmp_path, text):
    (tmp_path / checkpoints.MANIFEST).write_text(text)
    with pytest.raises(checkpoints.CheckpointDamaged, match="not a valid manifest"):
        checkpoints.verify(tmp_path)


def with_extras_number(text: str) -> str:
    config = json.loads(text)
    config["extra_special_tokens"] = 5
    return json.dumps(config)


@pytest.mark.parametrize(("damage", "message"), [
    (with_extras_number, "'extra_special_tokens' holds a JSON int, not a list of tokens"),
    (lambda text: DEEP, "maximum recursion depth exceeded"),
], ids=["extras-number", "deep-nesting"])
def test_a_tokenizer_config_that_breaks_the_reader_is_named(model_dir, damage, message):
    path = model_dir / tokenizer_files.CONFIG_FILE
    path.write_text(damage(path.read_text()))
    with pytest.raises(UserError) as refused:
        tokenizer_files.read(model_dir)
    assert str(path) in str(refused.value) and message in str(refused.value)


# -- a FIFO where a file belongs: its reader would wait for a writer for ever -------------------------------------

@pytest.mark.timeout(20)
def test_pending_rollouts_in_a_fifo_are_refused_not_waited_for(tmp_path):
    """``/dev/zero`` there (the same check refuses it) would be read until memory ran out."""
    fifo = tmp_path / PENDING
    os.mkfifo(fifo)
    with pytest.raises(UserError) as refused:
        read_pending(tmp_path, 4, ["speaker"])
    assert str(refused.value).startswith(f"{fifo}: ") and "not a regular file" in str(refused.value)


CHECK_WEIGHTS = """
import sys
from unimas.errors import UserError
from unimas.groups.hf.weight_files import check_weights
try:
    check_weights(sys.argv[1])
except UserError as refused:
    print(refused)
"""


@pytest.mark.timeout(120)
def test_a_fifo_among_snapshot_weights_is_refused(tmp_path):
    """Resuming checks a pooled snapshot's safetensors headers: a FIFO there would block the resume for ever.

    In a child process: the safetensors reader blocks in Rust holding the GIL, so no timeout in this
    process could end it.
    """
    fifo = tmp_path / "model" / "model.safetensors"
    fifo.parent.mkdir()
    os.mkfifo(fifo)
    try:
        done = subprocess.run([sys.executable, "-c", CHECK_WEIGHTS, str(tmp_path)], capture_output=True, text=True,
                              timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail(f"still waiting on {fifo} after 60 s")
    assert done.stdout.startswith(f"{fifo}: not a regular file"), done.stdout + done.stderr


# -- a chat template that does not end ---------------------------------------------------------------------------

@pytest.mark.timeout(600)  # a hang guard only: the budget is CPU time, so a busy machine stretches the wall time
@pytest.mark.parametrize(("template", "message"), [
    ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
     "runs for more than 1 s of CPU time"),
    ("{% for i in range(100000) %}{{ 'x' * 100 }}{% endfor %}", "writes 10000000 characters"),
], ids=["nested-loops", "enormous-output"])
def test_a_chat_template_that_loops_or_floods_is_refused_at_load(model_dir, monkeypatch, template, message):
    """The flood writes its 10 MB in about 0.04 s of CPU; at load 12-17 that took over 1 s of wall time, and a
    wall-clock budget called it a loop. The budget is the rendering thread's CPU time now."""
    monkeypatch.setattr(chat, "TEMPLATE_SECONDS", 1.0)
    (model_dir / "chat_template.jinja").write_text(template)
    with pytest.raises(UserError) as refused:
        load(model_dir)
    assert str(refused.value).startswith(f"{model_dir / 'chat_template.jinja'}: ") and message in str(refused.value)


def rewrite_header(directory: Path, change: Callable[[dict[str, Any]], None]) -> None:
    """Edit the JSON header of ``model.safetensors`` in place, leaving the tensor bytes as they were."""
    path = directory / "model.safetensors"
    data = path.read_bytes()
    length = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + length])
    change(header)
    text = json.dumps(header).encode()
    path.write_bytes(len(text).to_bytes(8, "little") + text + data[8 + length:])


@pytest.mark.parametrize(("damage", "message"), [
    (lambda path: path.write_bytes((2**60).to_bytes(8, "little") + b"{}"), "header too large"),
    (lambda path: rewrite_header(path.parent, lambda header: header["model.norm.weight"].update(
        data_offsets=[0, 10**12])), "invalid offset"),
], ids=["huge-header-length", "offset-out-of-range"])
def test_a_safetensors_header_that_lies_is_refused_naming_the_file(model_dir, damage, message):
    weights = model_dir / "model.safetensors"
    damage(weights)
    with pytest.raises(UserError) as refused:
        load(model_dir)
    assert str(refused.value).startswith(f"{weights}: not a readable safetensors file") and message in str(
        refused.value)
