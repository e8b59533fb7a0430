"""The `unimas` command line.

User mistakes (bad config, unknown plugin, missing file) exit with code 2 and
one paragraph naming the field or file; `--debug` shows the traceback.
"""

from __future__ import annotations

import argparse
import faulthandler
import math
import signal
import sys
import traceback
from pathlib import Path

from unimas.errors import RunError, UserError


def _parsed(text: str, kind: type[int] | type[float]) -> int | float:
    """``text`` as an int or float; an argparse error that says which one is needed (not the type's name)."""
    try:
        return kind(text)
    except ValueError:
        needed = "a whole number" if kind is int else "a number"
        raise argparse.ArgumentTypeError(f"must be {needed}, got {text!r}") from None


def _non_negative_int(text: str) -> int:
    """An argparse type: a whole number >= 0 (a negative count reached the code that indexes with it)."""
    value = _parsed(text, int)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


def _positive_int(text: str) -> int:
    """An argparse type: a whole number >= 1."""
    value = _parsed(text, int)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, got {value}")
    return value


def _port(text: str) -> int:
    """An argparse type: a TCP port, 0 (any free one) to 65535 (a larger one crashed in ``bind``)."""
    value = _parsed(text, int)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port from 0 to 65535, got {value}")
    return value


def _finite_float(text: str) -> float:
    """An argparse type: a number that is not NaN or infinite (an infinite limit cannot become an rlimit)."""
    value = _parsed(text, float)
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text}")
    return value


def _config_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", help="experiment YAML")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config value, e.g. --set trainer.steps=50 (repeatable)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="unimas", description="Train LLM multi-agent systems with RL.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks for every error")
    sub = parser.add_subparsers(dest="command", required=True)

    train = sub.add_parser("train", help="train a multi-agent system")
    _config_args(train)
    train.add_argument("--run-dir", type=Path, help="run directory (default: a new folder under runs/)")
    train.add_argument("--resume", action="store_true", help="continue from the latest complete checkpoint")
    train.add_argument("--dry-run", action="store_true", help="validate and print the placement plan, then stop")

    validate = sub.add_parser("validate", help="check a config before any model loads")
    _config_args(validate)
    validate.add_argument("--episodes", type=_non_negative_int, default=0, metavar="N",
                          help="also run N episodes with stand-in models (random tokens, no weights) through the "
                               "real controller, rewards and credit, and report what they did")
    validate.add_argument("--cluster", type=Path, metavar="FILE",
                          help="also print the placement plan on the cluster FILE describes (a YAML list of nodes "
                               "with cpus, gpus, memory_gb and custom resources; docs/runtime.md), or the first "
                               "group that does not fit")

    plugins = sub.add_parser("plugins", help="list registered plugins by kind")
    plugins.add_argument("--verbose", action="store_true", help="also list each algorithm plugin's parameters "
                         "with their types, defaults and descriptions")

    evaluate = sub.add_parser("eval", help="evaluate a checkpoint without training")
    _config_args(evaluate)
    evaluate.add_argument("--checkpoint", type=Path, help="checkpoint dir (checkpoints/step_N of a run)")
    evaluate.add_argument("--run-dir", type=Path, help="where to write results (default: new folder under runs/)")

    serve = sub.add_parser("serve", help="serve a checkpoint's roles as an OpenAI-compatible API (docs/gateway.md)")
    _config_args(serve)
    serve.add_argument("--checkpoint", type=Path, help="checkpoint dir (checkpoints/step_N of a run); default: the "
                                                       "config's initial weights")
    serve.add_argument("--port", type=_port, default=0, help="port (default: a free one, printed)")
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default: loopback only); any "
                       "other needs an API key: $UNIMAS_SERVE_TOKEN, or a generated one printed at start")

    report = sub.add_parser("report", help="write report.html and plots for a run directory, or one page "
                                           "overlaying several runs (docs/report.md)")
    report.add_argument("run_dirs", type=Path, nargs="+", metavar="RUN_DIR",
                        help="one run directory, or several to overlay (one series per run in every chart)")
    report.add_argument("--out", type=Path, metavar="FILE", help="where the page goes (default: RUN_DIR/report.html "
                        "for one run; compare.html in the first RUN_DIR for several)")

    warm = sub.add_parser("warmstart", help="fit each role's model group on (prompt, answer) pairs before RL",
                          description="Supervised warm start: every pair of FILE.jsonl (one "
                                      "{\"role\": R, \"vars\": {...}, \"answer\": A} a line) is rendered "
                                      "exactly as role R's turn renders it; each model group those roles map to "
                                      "is fitted on its pairs and written to OUT/<group>, a checkpoint "
                                      "models.<group>.options.init_from takes (docs/credit.md, Warm start).")
    _config_args(warm)
    warm.add_argument("--data", type=Path, required=True, metavar="FILE.jsonl", help="the training pairs")
    warm.add_argument("--out", type=Path, required=True, metavar="DIR", help="where OUT/<group> checkpoints go")
    warm.add_argument("--steps", type=_positive_int, default=500, help="optimiser steps per group (default 500)")
    warm.add_argument("--batch-size", type=_positive_int, default=32, help="pairs per step (default 32)")
    warm.add_argument("--lr", type=_finite_float, help="learning rate (default: the group's optim.lr)")
    warm.add_argument("--seed", type=_non_negative_int, default=0, help="seeds the batches and torch (default 0)")
    warm.add_argument("--eval", dest="eval_data", type=Path, metavar="FILE.jsonl",
                      help="held-out pairs: greedy exact-match accuracy logged every --eval-every steps")
    warm.add_argument("--eval-every", type=_positive_int, default=50, help="steps between evaluations (default 50)")
    warm.add_argument("--target", type=_finite_float, help="stop a group once its eval accuracy reaches this")

    sandbox = sub.add_parser("sandbox", help="run a Python file in the code sandbox and print the result as JSON",
                             description="Run FILE in the bubblewrap sandbox that the run_python tool uses and "
                                         "print one JSON object: status (ok, error, timeout, memory, refused), "
                                         "exit_code, stdout, stderr, duration_s, notes. Exit code 0 when status "
                                         "is ok, 1 otherwise, 2 when FILE cannot be read.")
    sandbox.add_argument("file", type=Path, help="Python source to run (as main.py in a throwaway directory)")
    sandbox.add_argument("--timeout", type=_finite_float, default=10.0, metavar="S",
                         help="wall-clock limit (default 10)")
    sandbox.add_argument("--memory-mb", type=int, default=512, metavar="M", help="memory limit (default 512)")
    sandbox.add_argument("--stdin", type=Path, metavar="FILE", help="file whose text is the program's stdin")
    sandbox.add_argument("--allow-fallback", action="store_true",
                         help="without bubblewrap, run with rlimits only (no namespaces: weaker, see "
                              "docs/workflows/sandbox.md) instead of refusing")

    return parser


def main(argv: list[str] | None = None) -> int:
    _dump_stacks_on_sigusr1()
    args = build_parser().parse_args(argv)
    try:
        return _dispatch(args)
    except UserError as exc:
        return _fail(exc, 2, args.debug)
    except RunError as exc:  # a failed group or too many failed episodes: one clear line, no traceback
        return _fail(exc, 1, args.debug)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


def _dump_stacks_on_sigusr1() -> None:
    """``kill -USR1 PID`` prints every thread's stack to stderr and the run goes on: where a run that seems
    stuck waits (docs/reliability.md). In C, so it answers even while Python is blocked."""
    if hasattr(signal, "SIGUSR1"):
        try:
            faulthandler.register(signal.SIGUSR1, all_threads=True)
        except (RuntimeError, ValueError, OSError):  # stderr without a file descriptor (captured): nowhere to dump
            pass


def _fail(exc: BaseException, code: int, debug: bool) -> int:
    """Print the error (with ``--debug``: the traceback, including the user code that caused it); the exit code."""
    if debug:
        traceback.print_exception(exc, file=sys.stderr)
    print(f"error: {exc}", file=sys.stderr)
    return code


def _dispatch(args: argparse.Namespace) -> int:
    if args.command == "sandbox":  # a debugging command that needs neither torch nor the trainer
        from unimas.sandbox.cli import cli_command

        return cli_command(args)

    from unimas import commands  # each command imports what it needs: `unimas --help` and parse errors need none

    return getattr(commands, f"cmd_{args.command}")(args)


if __name__ == "__main__":
    sys.exit(main())
