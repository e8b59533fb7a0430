"""Every document a doc names by file name (``credit.md``, ``seed-papers.md``) is in the repository.

``tests/test_docs_consistency.py`` checks paths with a folder (``docs/x.md``); a bare name slipped
through: docs/algorithms.md cited a ``seed-papers.md`` that never shipped.
"""

from __future__ import annotations

import re

from tests.conftest import REPO

DOCS = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
BARE_NAME = re.compile(r"(?<![\w/.-])([\w-]+\.md)\b")


def test_every_markdown_file_a_doc_names_exists():
    missing = [f"{doc.relative_to(REPO)}:{number}: {name}" for doc in DOCS
               for number, line in enumerate(doc.read_text().splitlines(), 1) for name in BARE_NAME.findall(line)
               if not any((folder / name).is_file() for folder in (doc.parent, REPO / "docs", REPO))]
    assert missing == []
