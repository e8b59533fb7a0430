"""`unimas report` on damaged run directories, and escaping of untrusted text in the page.

A run directory may come from a killed run, a full disk or a hand edit, and
model output is arbitrary text. Each damaged copy of one real run must either
render (naming what was skipped in a warning line and on the page) or exit 2
with one message naming the file, never a traceback; model text must reach the
page only as text.
"""

from __future__ import annotations

import hashlib
import json
import pickle
import re
import shutil
import subprocess
from pathlib import Path
from typing import Callable

import pytest

from unimas.cli import main

QUICKSTART = Path(__file__).resolve().parents[1] / "examples" / "quickstart.yaml"
CHROMIUM = Path("/usr/bin/chromium")
TRAIN = "trajectories/train.jsonl"


@pytest.fixture(autouse=True)
def plots_drawn_once_per_data(monkeypatch, tmp_path_factory):
    """Most damage leaves what the PNG plots show unchanged (the damaged line is skipped): such copies get the
    files drawn for the same data (about 1.2 s of matplotlib each). The plots read only the records, roles,
    groups and episodes (unimas/report/plots.py), so those are the key; new data is drawn as usual."""
    from unimas.report import plots

    draw = plots.write_plots

    def write_plots(run, directory: Path) -> dict[str, Path]:
        key = hashlib.sha256(pickle.dumps((run.records, run.roles, run.groups, run.episodes))).hexdigest()
        drawn = DRAWN.get(key)
        if drawn is None:
            drawn = DRAWN[key] = draw(run, tmp_path_factory.mktemp("plots"))
        directory.mkdir(parents=True, exist_ok=True)
        return {stem: Path(shutil.copy(path, directory / path.name)) for stem, path in drawn.items()}

    monkeypatch.setattr(plots, "write_plots", write_plots)


DRAWN: dict[str, dict[str, Path]] = {}
"""Data digest -> the plot files drawn for it, for this module's tests."""


@pytest.fixture(scope="module")
def small_run(tmp_path_factory) -> Path:
    """A real two-step quickstart run without a report: the undamaged original every case copies."""
    run = tmp_path_factory.mktemp("small-run") / "run"
    short = ["--set", "trainer.steps=2", "--set", "trainer.tasks_per_step=4", "--set", "trainer.eval_size=4",
             "--set", "logging.report=false"]
    assert main(["train", str(QUICKSTART), "--run-dir", str(run), *short]) == 0
    return run


def _append(name: str, data: bytes) -> Callable[[Path], None]:
    def damage(run: Path) -> None:
        with open(run / name, "ab") as handle:
            handle.write(data)
    return damage


def _write(name: str, data: bytes) -> Callable[[Path], None]:
    return lambda run: (run / name).write_bytes(data)


def _into_dir(name: str) -> Callable[[Path], None]:
    def damage(run: Path) -> None:
        path = run / name
        shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
        path.mkdir()
    return damage


def _episode(change: Callable[[dict], object]) -> Callable[[Path], None]:
    """Rewrite the first training episode with ``change`` applied (it edits the dict in place)."""
    def damage(run: Path) -> None:
        first, *rest = (run / TRAIN).read_text().splitlines()
        episode = json.loads(first)
        change(episode)
        (run / TRAIN).write_text("\n".join([json.dumps(episode), *rest]) + "\n")
    return damage


def _cycle(episode: dict) -> None:
    ids = [n["id"] for n in episode["nodes"]]
    episode["edges"].append([ids[-1], ids[0]])


def _non_string_fields(episode: dict) -> None:
    node = episode["nodes"][0]
    node.update(text={"tokens": [1, 2]}, role=7, reward="high", started="soon", response_ids=3, parsed=[1])
    episode.update(rewards=[1], step=1, outcome={"x": float("nan")}, started="then", error={"why": 1})


def _not_utf8(run: Path) -> None:
    data = (run / TRAIN).read_bytes()
    (run / TRAIN).write_bytes(data.replace(b'"text":"', b'"text":"\xff\xfe', 1))


def _into_file(run: Path) -> None:
    shutil.rmtree(run / "trajectories")
    (run / "trajectories").write_text("not a directory\n")


ALIAS_BOMB = b"a: &a [x, x, x, x, x, x, x, x, x]\n" + b"".join(
    b"%c: &%c [%s]\n" % (ord(c), ord(c), b", ".join([b"*" + p.encode()] * 9))
    for p, c in zip("abcdefgh", "bcdefghi"))

CASES = {
    # name: (damage, exit code, the file named as skipped or refused; None when nothing is skipped)
    "metrics line is an array": (_append("metrics.jsonl", b"[1, 2, 3]\n"), 0, "metrics.jsonl"),
    "metrics line is a string": (_append("metrics.jsonl", b'"step 3"\n'), 0, "metrics.jsonl"),
    "metrics step not numeric": (_append("metrics.jsonl", b'{"step": "three", "reward/mean": 1}\n'), 0,
                                 "metrics.jsonl"),
    "metrics step NaN": (_append("metrics.jsonl", b'{"step": NaN, "reward/mean": 1}\n'), 0, "metrics.jsonl"),
    "metrics not UTF-8": (_append("metrics.jsonl", b'{"step": 3, "reward/mean": 0.5, "x\xff\xfe": 1}\n'), 0,
                          "metrics.jsonl"),
    "metrics torn last line": (_append("metrics.jsonl", b'{"step": 3, "reward/me'), 0, "metrics.jsonl"),
    "metrics huge line": (_append("metrics.jsonl", b'{"step": 3, "x": "' + b"a" * (2 << 20) + b'"}\n'), 0,
                          "metrics.jsonl"),
    "metrics huge integer": (_append("metrics.jsonl", b'{"step": 3, "reward/mean": 1' + b"0" * 5000 + b"}\n"), 0,
                             "metrics.jsonl"),
    "metrics empty": (_write("metrics.jsonl", b""), 0, None),
    "metrics NaN and Infinity": (_append("metrics.jsonl", b'{"step": 3, "reward/mean": NaN, "reward/std": '
                                                          b'Infinity, "eval/accuracy": -Infinity}\n'), 0, None),
    "metrics is a directory": (_into_dir("metrics.jsonl"), 2, "metrics.jsonl"),
    "config garbage bytes": (_write("config.yaml", bytes(range(256)) * 4), 0, "config.yaml"),
    "config malformed YAML": (_write("config.yaml", b"name: [unclosed\nroles: {a: 1\n"), 0, "config.yaml"),
    "config is a list": (_write("config.yaml", b"- a\n- b\n"), 0, "config.yaml"),
    "config alias bomb": (_write("config.yaml", ALIAS_BOMB), 0, "config.yaml"),
    "config sections of the wrong type": (_write("config.yaml", b"roles: [a, b]\nmodels: 3\nrewards: {x: 1}\n"
                                                                b"trainer: {steps: many}\nname: {a: 1}\n"), 0,
                                          "config.yaml"),
    "config is a directory": (_into_dir("config.yaml"), 0, "config.yaml"),
    "node without an id": (_episode(lambda e: e["nodes"][0].pop("id")), 0, TRAIN),
    "edges form a cycle": (_episode(_cycle), 0, TRAIN),
    "edges malformed": (_episode(lambda e: e.update(edges=[["a"], 5])), 0, TRAIN),
    "episode step not numeric": (_episode(lambda e: e.update(step="late")), 0, TRAIN),
    "node fields of the wrong type": (_episode(_non_string_fields), 0, None),
    "node with no nodes": (_episode(lambda e: e.update(nodes=[], edges=[])), 0, None),
    "trajectory line not an object": (_append(TRAIN, b"[1, 2]\n"), 0, TRAIN),
    "trajectory line not JSON": (_append(TRAIN, b"{nope}\n"), 0, TRAIN),
    "trajectory not UTF-8": (_not_utf8, 0, TRAIN),
    "trajectory huge line": (_episode(lambda e: e["nodes"][0].update(text="x" * (3 << 20))), 0, None),
    "trajectories file is a directory": (_into_dir(TRAIN), 0, TRAIN),
    "trajectories dir is a file": (_into_file, 0, "trajectories"),
    "trajectories dir missing": (lambda run: shutil.rmtree(run / "trajectories"), 0, None),
    "report.html is a directory": (_into_dir("report.html"), 2, "report.html"),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_damaged_run_directory_renders_or_exits_2_naming_the_file(case, small_run, tmp_path, capsys):
    damage, code, named = CASES[case]
    run = tmp_path / "run"
    shutil.copytree(small_run, run)
    damage(run)
    capsys.readouterr()
    assert main(["report", str(run)]) == code
    err = capsys.readouterr().err
    assert "Traceback" not in err
    if code == 2:
        assert err.startswith("error: ") and err.count("\n") == 1 and str(run / named) in err, err
        return
    page = (run / "report.html").read_text(encoding="utf-8")
    assert 'id="report-data"' in page
    if named is None:
        assert "warning:" not in err and 'id="skipped"' not in page, err
    else:
        assert re.search(rf"^warning: {re.escape(str(run / named))}\b", err, re.M), err
        assert 'id="skipped"' in page and named in page


def test_a_long_damaged_file_is_named_a_bounded_number_of_times(small_run, tmp_path, capsys):
    """Thousands of bad lines make a few warnings and a count, not thousands of lines."""
    run = tmp_path / "run"
    shutil.copytree(small_run, run)
    _append("metrics.jsonl", b"[]\n" * 5000)(run)
    assert main(["report", str(run)]) == 0
    warnings = capsys.readouterr().err.splitlines()
    assert 5 < len(warnings) < 30 and "more damaged lines skipped" in warnings[-1]


HOSTILE = ["<!--<script>window.__pwned=1</script>", "</script><script>alert(1)</script>", "\"'&",
           "<!--<script>document.documentElement.dataset.pwned='comment'</script>",
           "</script><script>document.documentElement.dataset.pwned='close'</script>",
           "line\u2028separator\u2029 \ufffd <b>bold</b>"]


def _hostile_run(small_run: Path, tmp_path: Path) -> Path:
    """Every training turn says all of HOSTILE; the run name, a role name and a metric name are hostile too."""
    run = tmp_path / "hostile"
    shutil.copytree(small_run, run)
    episodes = [json.loads(line) for line in (run / TRAIN).read_text().splitlines()]
    for episode in episodes:
        episode["task"]["id"] = HOSTILE[1]
        for node in episode["nodes"]:
            node["text"] = "\n".join(HOSTILE)
    (run / TRAIN).write_text("".join(json.dumps(e) + "\n" for e in episodes))
    config = (run / "config.yaml").read_text()
    (run / "config.yaml").write_text(re.sub(r"(?m)^name: .*$", "name: '</script><script>alert(2)</script>'", config))
    _append("metrics.jsonl", b'{"step": 2, "</td><script>alert(3)</script>": 1}\n')(run)
    return run


@pytest.mark.slow
def test_model_text_is_escaped_in_every_context(small_run, tmp_path):
    run = _hostile_run(small_run, tmp_path)
    assert main(["report", str(run)]) == 0
    page = (run / "report.html").read_text(encoding="utf-8")
    block = re.search(r'<script type="application/json" id="report-data">(.*?)</script>', page, re.S).group(1)
    assert "<" not in block and ">" not in block and "&" not in block and "\u2028" not in block
    data = json.loads(block)
    episodes = data["runs"][0]["episodes"]["train"]
    texts = [n["text"] for e in episodes for n in e["nodes"]]
    assert texts and all(text == "\n".join(HOSTILE) for text in texts)
    assert {e["task_label"] for e in episodes} == {HOSTILE[1]}
    outside = page.replace(block, "")
    assert outside.count("<script") == 2, "only the data block and the viewer script"
    assert "alert(2)" in outside and "<script>alert(2)" not in outside  # the run name, escaped as HTML
    assert "alert(3)" in outside and "<script>alert(3)" not in outside  # the metric name


@pytest.mark.slow
@pytest.mark.skipif(not CHROMIUM.exists(), reason="needs the Debian `chromium` package at /usr/bin/chromium")
def test_hostile_text_renders_as_text_in_headless_chromium(small_run, tmp_path):
    run = _hostile_run(small_run, tmp_path)
    assert main(["report", str(run)]) == 0
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run",
             f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=3000", "--dump-dom"]
    dom = subprocess.run([str(CHROMIUM), *flags, (run / "report.html").as_uri()], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    assert "data-pwned" not in dom, "model output ran as script"
    assert re.search(r'<svg id="episode-graph"', dom), "the viewer drew no graph"
    assert "&lt;/script&gt;&lt;script&gt;alert(1)&lt;/script&gt;" in dom  # shown as text in the node details
    assert "&lt;!--&lt;script&gt;window.__pwned=1&lt;/script&gt;" in dom
