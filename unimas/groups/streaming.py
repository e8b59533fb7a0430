"""The text of an answer while it is sampled: what may be shown before the answer is finished.

A streamed gateway request (``GenRequest.progress``) is shown its text as it
grows, and what was shown can never be taken back, so only text that no
later token can change is shown:

* complete characters only — a character split over several byte-level
  tokens decodes to U+FFFD until its last byte arrives;
* nothing from a stop string on (the answer's text ends before it), and not
  the longest end of the text that could still be the start of a stop
  string, until it is known not to be.

The concatenated stream then equals the finished answer's text.
"""

from __future__ import annotations

import logging
from typing import Callable, Optional, Sequence

log = logging.getLogger(__name__)

INCOMPLETE = "\ufffd"
"""What a tokenizer decodes the first bytes of an unfinished character to."""


def shown_text(text: str, stops: Sequence[str] = ()) -> str:
    """The part of ``text`` (decoded so far) that later tokens cannot change, given the ``stops``."""
    text = text.rstrip(INCOMPLETE)
    found = [text.find(stop) for stop in stops if stop in text]
    if found:
        return text[:min(found)]
    longest = max((len(stop) for stop in stops), default=1) - 1
    for size in range(min(longest, len(text)), 0, -1):
        if any(stop.startswith(text[-size:]) for stop in stops):
            return text[:-size]
    return text


class TextProgress:
    """One streamed row of a batch: collects its sampled ids and reports the text that may be shown."""

    def __init__(self, decode: Callable[[list[int]], str], stops: Optional[Sequence[str]],
                 report: Callable[[str], None]):
        self.decode = decode
        self.stops = list(stops or [])
        self.report: Optional[Callable[[str], None]] = report
        self.ids: list[int] = []
        self.shown = ""

    def start(self) -> None:
        """The prompt was rendered: sampling begins (the stream can open)."""
        self._send("")

    def add(self, token: int) -> None:
        if self.report is None:
            return
        self.ids.append(token)
        text = shown_text(self.decode(self.ids), self.stops)
        if len(text) > len(self.shown) and text.startswith(self.shown):
            self.shown = text
            self._send(text)

    def _send(self, text: str) -> None:
        """A listener that fails (its client left) stops listening; the batch it is sampled in goes on."""
        if self.report is None:
            return
        try:
            self.report(text)
        except Exception:  # noqa: BLE001 - a stream's failure is never the batch's
            log.debug("a streamed answer's listener failed; it gets the rest in one piece", exc_info=True)
            self.report = None
