"""Read a run directory's files defensively, naming every damaged part that is left out.

The run directory may come from a killed run, a full disk or a hand edit.
Each reader here returns what it could read and reports the rest through a
``note(line, why)`` callback, so the report can say what it did not show
instead of failing on the first bad byte.
"""

from __future__ import annotations

import os
import secrets
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Callable, Iterator

import yaml

from unimas.errors import UserError
from unimas.output.jsonl import text_lines
from unimas.output.metrics import read_metrics
from unimas.output.run_end import RunEnd, read_run_end
from unimas.safe_load import open_regular

Note = Callable[[int | None, str], None]
"""``note(line number or None, why)``: records one damaged part of one file."""

MAX_LINE = 64 << 20
"""Bytes per trajectory line; a longer one is damage, and reading it whole could exhaust memory."""
MAX_CONFIG = 1 << 20
"""Bytes of config.yaml read; a resolved config is a few KB."""
MAX_YAML_NODES = 100_000
"""Nodes config.yaml may expand to through aliases, so an alias bomb is refused rather than expanded."""
NOTES_PER_FILE = 20
"""Skipped lines named per file; the rest are counted."""


@dataclass
class Skipped:
    """A damaged part of the run directory the report left out or repaired, named for the reader."""

    file: str
    """Relative to the run directory."""
    line: int | None
    why: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.why}" if self.line else f"{self.file}: {self.why}"


def replace_file(path: Path, data: bytes) -> None:
    """Write ``data`` into a new file beside ``path``, then rename it over ``path``.

    What the run directory holds at that name is replaced, never written through: a symlink planted as
    ``plots/rewards.png`` or ``report.html`` would have the report overwrite the file it points at (the
    run's metrics.jsonl, or any file of the user's), and a FIFO would block the writer forever.
    """
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
    try:
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # the umask applies
        with open(descriptor, "wb") as handle:
            handle.write(data)
        os.replace(temporary, path)
    finally:
        if os.path.lexists(temporary):
            os.unlink(temporary)


def metrics_records(path: Path, note: Note) -> list[dict[str, Any]]:
    """The readable records of metrics.jsonl; a file that cannot be opened at all is the user's to fix."""
    if not path.exists():
        return []
    skipped: list[tuple[int, str]] = []
    try:
        open_regular(path).close()  # read_metrics opens it by name: refuse a pipe or a device first
        records = read_metrics(path, skipped)
    except OSError as exc:
        raise UserError(f"cannot be read ({exc.strerror or exc})", where=str(path)) from None
    for line, why in skipped:
        note(line, why + "; skipped")
    return records


def bounded(skipped: list[Skipped]) -> list[Skipped]:
    """At most ``NOTES_PER_FILE`` notes per file, then one that counts the rest."""
    by_file: dict[str, list[Skipped]] = defaultdict(list)
    for item in skipped:
        by_file[item.file].append(item)
    kept = []
    for file, items in by_file.items():
        kept.extend(items[:NOTES_PER_FILE])
        if len(items) > NOTES_PER_FILE:
            kept.append(Skipped(file, None, f"{len(items) - NOTES_PER_FILE} more damaged lines skipped"))
    return kept


SECTIONS = {"roles": dict, "models": dict, "rewards": list, "trainer": dict}
"""The config.yaml parts the report reads, and the type each must have."""


def read_config(path: Path, note: Note) -> dict[str, Any]:
    """config.yaml as a plain dict with every part in ``SECTIONS`` present and of its type.

    Safe loader, size cap and alias expansion cap; whatever is unreadable is
    noted and left out, costing only the role mapping.
    """
    tree = _load_yaml(path, note) if path.exists() else None
    if tree is not None and not isinstance(tree, dict):
        note(None, f"a YAML {type(tree).__name__} at the top, not a mapping; ignored")
    config = dict(tree) if isinstance(tree, dict) else {}
    for key, kind in SECTIONS.items():
        value = config.get(key)
        if value is not None and not isinstance(value, kind):
            note(None, f"'{key}' is a {type(value).__name__}, not a {kind.__name__}; ignored")
        value = value if isinstance(value, kind) else kind()
        config[key] = {str(k): v for k, v in value.items()} if kind is dict else value
    return config


def config_text(path: Path) -> str | None:
    """config.yaml's text for the page (invalid UTF-8 replaced); None when absent, unreadable or over the cap
    (:func:`read_config` has noted why)."""
    try:
        with open_regular(path) as handle:
            raw = handle.read(MAX_CONFIG + 1)
    except OSError:
        return None
    return raw.decode("utf-8", errors="replace") if len(raw) <= MAX_CONFIG else None


def read_end(root: Path, note: Note) -> RunEnd | None:
    """run_end.json, or None when absent; a damaged one is noted and ignored (the run reads as unfinished)."""
    try:
        return read_run_end(root)
    except UserError as exc:
        note(None, f"{str(exc).removeprefix(f'{exc.where}: ')}; ignored")
        return None


def _load_yaml(path: Path, note: Note) -> Any:
    try:
        with open_regular(path) as handle:
            raw = handle.read(MAX_CONFIG + 1)
        text = raw.decode("utf-8")
        if len(raw) > MAX_CONFIG:
            note(None, f"larger than {MAX_CONFIG} bytes; ignored")
        elif _expanded(yaml.compose(text, Loader=yaml.SafeLoader), {}) > MAX_YAML_NODES:
            note(None, f"its aliases expand to over {MAX_YAML_NODES} nodes (an alias bomb?); ignored")
        else:
            return yaml.safe_load(text)
    except OSError as exc:
        note(None, f"cannot be read ({exc.strerror or exc}); ignored")
    except UnicodeDecodeError:
        note(None, "not UTF-8 text; ignored")
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        note(mark.line + 1 if mark else None, f"not valid YAML ({exc.problem or exc.context}); ignored")
    except (yaml.YAMLError, ValueError, RecursionError) as exc:  # bad dates, nesting too deep
        note(None, f"not valid YAML ({type(exc).__name__}); ignored")
    return None


def _expanded(node: yaml.Node | None, sizes: dict[int, int]) -> int:
    """Nodes of the document with aliases expanded: a few aliases can stand for billions."""
    if node is None:
        return 0
    if id(node) not in sizes:
        sizes[id(node)] = MAX_YAML_NODES + 1  # a node that contains itself expands without end
        children = node.value if isinstance(node, yaml.SequenceNode) else \
            [part for pair in node.value for part in pair] if isinstance(node, yaml.MappingNode) else []
        sizes[id(node)] = 1 + sum(_expanded(child, sizes) for child in children)
    return sizes[id(node)]


def json_lines(handle: IO[bytes], note: Note) -> Iterator[tuple[int, str, bool]]:
    """(number, text, ends with a newline) per non-blank line of a trajectory file."""
    return text_lines(handle, note, MAX_LINE)
