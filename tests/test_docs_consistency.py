"""The docs agree with the code: the number of hooks they state, and every repo file they name exists."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest

from unimas.contract import hookspecs

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
NUMBERS = {word: n for n, word in enumerate("zero one two three four five six seven eight nine ten eleven twelve "
                                            "thirteen fourteen fifteen sixteen seventeen eighteen nineteen "
                                            "twenty".split())}
HOOK_COUNT = re.compile(r"(?:(\w+)\s+)?\b(\d+|" + "|".join(NUMBERS) + r")\s+(?:plugin\s+|pluggy\s+)?hook(?:spec)?s\b",
                        re.IGNORECASE)
PARTIAL = {"other", "remaining", "algorithm", "new", "these", "first", "last"}
"""Words before "N hooks" that make it a part, not the total ("the other two hooks")."""
CODE_SPAN = re.compile(r"`([^`\n]+)`")
REPO_PATH = re.compile(r"(?<![\w./~$-])((?:unimas|docs|examples|benchmarks|tests|scripts|plugins|workflows)/"
                       r"[\w./*{},-]*[\w*}/])")
LINK = re.compile(r"\]\(([^)#\s]+)")
BUILT = ("examples/models/",)
"""Paths the docs tell the reader to build or download first (git-ignored)."""


def lines() -> list[tuple[Path, int, str]]:
    return [(doc, number, line) for doc in DOCS for number, line in enumerate(doc.read_text().splitlines(), 1)]


def expand_braces(path: str) -> list[str]:
    """``a_{x,y}.md`` -> ``a_x.md``, ``a_y.md`` (shell brace expansion, as the docs write alternatives)."""
    parts = re.split(r"\{([^{}]*)\}", path)
    choices = [[part] if i % 2 == 0 else part.split(",") for i, part in enumerate(parts)]
    return ["".join(combo) for combo in itertools.product(*choices)]


def exists(path: str) -> bool:
    path = path.split("::")[0].rstrip(".,:")
    return path.startswith(BUILT) or any(ROOT.glob(path)) if "*" in path else (
        path.startswith(BUILT) or (ROOT / path).exists())


def hookspec_names() -> list[str]:
    return [name for name in dir(hookspecs) if name.startswith("unimas_")
            and hasattr(getattr(hookspecs, name), "unimas_spec")]


def test_hookspecs_are_counted():
    assert "unimas_workflows" in hookspec_names() and "unimas_credit_shapers" in hookspec_names()


def hook_counts(text: str) -> list[int]:
    """The totals of hooks ``text`` states ("the twelve hooks", "12 hookspecs"), not parts ("the other two")."""
    return [int(count) if count.isdigit() else NUMBERS[count.lower()]
            for before, count in HOOK_COUNT.findall(text) if before.lower() not in PARTIAL]


def prose(doc: Path) -> str:
    """The page with links reduced to their text and lines joined, so "eight [pluggy](...)\nhooks" reads."""
    return " ".join(re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", doc.read_text()).split())


def stated_hook_counts() -> list[tuple[str, int]]:
    return [(str(doc.relative_to(ROOT)), count) for doc in DOCS for count in hook_counts(prose(doc))]


def test_every_stated_hook_count_matches_the_hookspecs():
    specs = hookspec_names()
    stated = stated_hook_counts()
    assert stated, "the docs state the number of hooks somewhere (README.md: 'twelve hooks')"
    wrong = [(where, count) for where, count in stated if count != len(specs)]
    assert not wrong, f"{len(specs)} hookspecs in unimas/contract/hookspecs.py, the docs say otherwise: {wrong}"


def test_every_repo_path_in_the_docs_exists():
    missing = [f"{doc.relative_to(ROOT)}:{number}: {path}"
               for doc, number, line in lines() for span in CODE_SPAN.findall(line)
               for found in REPO_PATH.findall(span) for path in expand_braces(found) if not exists(path)]
    assert not missing, "\n".join(missing)


def test_every_page_named_in_the_docs_exists():
    """A bare ``name.md`` in backticks is a page of this repository (not of some reference kept elsewhere)."""
    pages = {path.name for path in ROOT.rglob("*.md") if ".venv" not in path.parts}
    missing = [f"{doc.relative_to(ROOT)}:{number}: {span}" for doc, number, line in lines()
               for span in CODE_SPAN.findall(line) if re.fullmatch(r"[\w.-]+\.md", span) and span not in pages]
    assert not missing, "\n".join(missing)


def test_every_relative_link_in_the_docs_exists():
    missing = [f"{doc.relative_to(ROOT)}:{number}: {target}" for doc, number, line in lines()
               for target in LINK.findall(line) if "://" not in target and not target.startswith("mailto:")
               and not (doc.parent / target).exists()]
    assert not missing, "\n".join(missing)


@pytest.mark.parametrize("text, counts", [("the twelve hooks", [12]), ("one of eight pluggy hooks", [8]),
                                          ("The other two hooks", []), ("12 hookspecs", [12]), ("a hook", [])])
def test_hook_counts_are_found_in_prose(text, counts):
    assert hook_counts(text) == counts


@pytest.mark.parametrize("page, must, must_not", [
    ("docs/reliability.md", "`unimas sandbox`", ("there is no sandbox", "no sandboxing", "not sandboxed at all")),
    ("docs/gateway.md", "pip install openai", ()),
])
def test_pages_say_what_issue_24_found_them_missing(page, must, must_not):
    text = (ROOT / page).read_text()
    assert must in text
    assert not any(phrase in text.lower() for phrase in must_not)
