"""Start-up cost: how long ``import unimas`` and the quick CLI commands take, and what they import.

A plugin author's ``import unimas`` and a user's ``unimas plugins`` or
``unimas validate`` should answer at once; they must not pay for torch,
transformers, verl or ray. Each command runs as a fresh subprocess (what a
user waits for, interpreter start included), best of ``--repeats``. A second
subprocess per command runs the same entry point in-process and reports how
many modules ended up in ``sys.modules`` and which heavy packages among them.

Two ``validate`` rows: a tiny model (everything follows from the options) and
a local model dir (``examples/quickstart_chat.yaml``: the chat template is read
from the dir's tokenizer files). That dir, ``examples/models/tiny-chat``, is
built first when missing (once, ~12 s on 2 cores; the example's own comment
says how).

    python benchmarks/startup.py            # best of 3 (~30 s on a 2-core machine)
    python benchmarks/startup.py --smoke    # one repetition each
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULT_PREFIX = "RESULT "

HEAVY = ("torch", "transformers", "verl", "ray", "numpy", "peft", "matplotlib", "tokenizers")
"""Top-level packages whose presence after start-up the table reports."""

COMMANDS: list[tuple[str, list[str] | None]] = [
    ('python -c "import unimas"', None),
    ("unimas --help", ["--help"]),
    ("unimas plugins", ["plugins"]),
    ("unimas plugins --verbose", ["plugins", "--verbose"]),
    ("unimas validate examples/quickstart.yaml", ["validate", "examples/quickstart.yaml"]),
    ("unimas validate examples/quickstart_chat.yaml", ["validate", "examples/quickstart_chat.yaml"]),
]

CHAT_MODEL = REPO / "examples" / "models" / "tiny-chat"
"""The model dir ``examples/quickstart_chat.yaml`` names."""

# Runs one command in-process, then reports what it imported. `--help` exits through SystemExit.
_COUNT_MODULES = """
import contextlib, io, json, sys
argv = json.loads(sys.argv[1])
with contextlib.redirect_stdout(io.StringIO()):
    if argv is None:
        import unimas
    else:
        from unimas.cli import main
        try:
            main(argv)
        except SystemExit:
            pass
roots = {name.split(".")[0] for name in sys.modules}
print(%r + json.dumps({"modules": len(sys.modules), "heavy": [h for h in %r if h in roots]}))
""" % (RESULT_PREFIX, HEAVY)


def command_line(argv: list[str] | None) -> list[str]:
    if argv is None:
        return [sys.executable, "-c", "import unimas"]
    return [sys.executable, "-m", "unimas.cli", *argv]


def time_once(cmd: list[str]) -> float:
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    return elapsed


def imported(argv: list[str] | None) -> dict:
    proc = subprocess.run([sys.executable, "-c", _COUNT_MODULES, json.dumps(argv)], cwd=REPO,
                          capture_output=True, text=True)
    line = next((line for line in proc.stdout.splitlines() if line.startswith(RESULT_PREFIX)), None)
    if proc.returncode != 0 or line is None:
        raise SystemExit(f"counting modules for {argv} failed:\n{proc.stderr[-3000:]}")
    return json.loads(line[len(RESULT_PREFIX):])


def ensure_chat_model() -> None:
    """Build :data:`CHAT_MODEL` if it is not there (``chat_model_dir`` never leaves a half-written dir)."""
    if (CHAT_MODEL / "model.safetensors").exists():
        return
    print(f"building {CHAT_MODEL.relative_to(REPO)} for the model-dir row (once, ~12 s on 2 cores)", file=sys.stderr)
    build = "import sys; from unimas.testing.tiny_chat import chat_model_dir; chat_model_dir(sys.argv[1])"
    proc = subprocess.run([sys.executable, "-c", build, str(CHAT_MODEL.parent)], cwd=REPO, capture_output=True,
                          text=True)
    if proc.returncode != 0:
        raise SystemExit(f"building {CHAT_MODEL} failed:\n{proc.stderr[-3000:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="runs per command; the table shows the best")
    parser.add_argument("--smoke", action="store_true", help="one run per command")
    parser.add_argument("--json", help="also write the raw results here")
    args = parser.parse_args()
    repeats = 1 if args.smoke else args.repeats
    ensure_chat_model()

    results = []
    for label, argv in COMMANDS:
        cmd = command_line(argv)
        times = [time_once(cmd) for _ in range(repeats)]
        results.append({"command": label, "best_s": min(times), "times_s": times, **imported(argv)})

    print(f"Start-up, best of {repeats} (fresh subprocess each, interpreter start included)\n")
    print("| command | best (s) | modules imported | heavy packages imported |")
    print("|---|---:|---:|---|")
    for row in results:
        print(f"| `{row['command']}` | {row['best_s']:.2f} | {row['modules']:,} | {', '.join(row['heavy']) or '—'} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"repeats": repeats, "results": results}, indent=1))


if __name__ == "__main__":
    main()
