"""Reading the JSONL files of a run that may have been killed or damaged: line by line, never fatal."""

from __future__ import annotations

from typing import IO, Callable, Iterator

Note = Callable[[int, str], None]
"""Called with (line number, why) for each line that was skipped or repaired."""


def text_lines(handle: IO[bytes], note: Note, max_line: int) -> Iterator[tuple[int, str, bool]]:
    """(number, text, ends with a newline) per non-blank line; over-long lines skipped, bad UTF-8 replaced."""
    for number, raw in enumerate(iter(lambda: handle.readline(max_line + 1), b""), start=1):
        if len(raw) > max_line:
            while raw and not raw.endswith(b"\n"):  # drop the rest of the over-long line
                raw = handle.readline(max_line)
            note(number, f"longer than {max_line} bytes; skipped")
            continue
        if not raw.strip():
            continue
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            text = raw.decode("utf-8", errors="replace")
            note(number, "invalid UTF-8, shown with replacement characters")
        yield number, text, raw.endswith(b"\n")
