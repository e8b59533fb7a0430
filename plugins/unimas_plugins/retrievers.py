"""Retriever tools: BM25 over a local corpus, a client for an HTTP retrieval server, evidence formatting.

Tools (``ctx.tool(name, ...)`` in Python workflows, ``kind: tool`` nodes in graphs):

* ``bm25_search(query, k=3, corpus=None, world_seed=0, people=60)`` -> ``[{id, title, text, score}]``:
  BM25 (``bm25s``) over a JSONL corpus (one ``{"id", "title", "text"}`` object per line; a relative path
  is relative to the working directory) or, with ``corpus`` unset, over the deterministic synthetic
  world of :func:`synthetic_world`. Each corpus is indexed once per process (cached by path, size and
  modification time). Passages with score 0 (no query term in common) are not returned.
* ``http_search(query, k=3, url=..., timeout_s=5, retries=2, backoff_s=0.5)`` -> the same shape: POSTs
  ``{"query": ..., "k": ...}`` as JSON to an existing retrieval server (http/https only). Timeouts,
  connection errors, HTTP 429 and 5xx are retried with exponential backoff; other HTTP errors and
  malformed answers are not. Every failure raises :class:`RetrievalError` with a message saying what
  happened, which ``ctx.tool`` records on the tool node: the episode goes on.
* ``format_passages(passages, selection=None, max_chars=600)`` -> text: numbered ``[i] title: text``
  lines cut to fit a small context; ``selection`` (e.g. ``"1, 3"``, a selector's output) keeps those.

Settings such as ``url`` or ``corpus`` are ordinary tool arguments: a Python workflow passes them from
its ``workflow.params`` (see ``unimas_workflows.retrieval_qa``), a graph node from literal ``inputs``.
Query text comes from a model: it is only tokenised or sent as JSON, never evaluated.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import re
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import unimas
from unimas import read_bytes

MAX_K = 50
MAX_SELECTION_DIGITS = 6
DIGITS = re.compile(r"\d+")
_INDEXES: dict[tuple, tuple[Any, list[dict]]] = {}
_LOCK = threading.Lock()


class RetrievalError(RuntimeError):
    """A retriever could not answer; recorded on the tool node as ``RetrievalError: <message>``."""


# -- the synthetic multi-hop world -------------------------------------------------------------------

_SYLLABLES = ("ka", "lo", "mi", "ra", "ten", "vo", "su", "del", "ni", "bar", "ol", "en", "za", "ri", "mon",
              "ta", "ve", "lis", "dor", "an", "pe", "qui", "sor", "ul", "fa", "gen", "ho", "jas", "ke", "wyn")
_ADJECTIVES = ("Silver", "Hidden", "Quiet", "Broken", "Golden", "Northern", "Last", "Painted", "Distant",
               "Burning", "Frozen", "Secret", "Hollow", "Bright", "Lonely", "Crimson")
_NOUNS = ("Lantern", "River", "Garden", "Tower", "Harbor", "Mirror", "Forest", "Bridge", "Letter", "Crown",
          "Island", "Clock", "Orchard", "Voyage", "Feather", "Valley")
_PROFESSIONS = ("novelist", "poet", "historian", "journalist", "playwright", "essayist")


def _name(rng: random.Random, syllables: int, taken: set[str]) -> str:
    """A new word of ``syllables`` syllables (one more after 50 tries, so large worlds always finish)."""
    tries = 0
    while True:
        word = "".join(rng.choice(_SYLLABLES) for _ in range(syllables + tries // 50)).capitalize()
        tries += 1
        if word not in taken:
            taken.add(word)
            return word


def synthetic_world(world_seed: int = 0, people: int = 60) -> dict[str, Any]:
    """A deterministic world of authors, books, cities and countries: passages plus the facts behind them.

    Same ``(world_seed, people)`` -> the same world on every machine (``random.Random`` only). Each author
    wrote one book and was born in a city; each city lies in a country. Passages: one per author
    (``person-i``), book (``book-i``) and city (``city-j``); questions need two of them (two hops).
    """
    if not isinstance(people, int) or not 2 <= people <= 5000:
        raise ValueError(f"people must be an integer between 2 and 5000, got {people!r}")
    rng = random.Random(f"unimas-synthetic-world-{world_seed}")
    taken: set[str] = set()
    countries = [_name(rng, 3, taken) + "ia" for _ in range(max(3, people // 10))]
    cities = [(_name(rng, 2, taken) + rng.choice(("ton", "burg", "vik", "mar")), rng.randrange(len(countries)))
              for _ in range(max(4, people // 3))]
    titles: set[str] = set()
    persons, passages = [], []
    for index in range(people):
        name = f"{_name(rng, 2, taken)} {_name(rng, 2, taken)}"
        title = f"The {rng.choice(_ADJECTIVES)} {rng.choice(_NOUNS)}"
        while title in titles:
            title = f"The {rng.choice(_ADJECTIVES)} {rng.choice(_NOUNS)} of {_name(rng, 2, taken)}"
        titles.add(title)
        city = rng.randrange(len(cities))
        persons.append({"index": index, "name": name, "book": title, "city": city,
                        "profession": rng.choice(_PROFESSIONS)})
    for p in persons:
        passages.append({"id": f"person-{p['index']}", "title": p["name"],
                         "text": f"{p['name']} is a {p['profession']} who was born in {cities[p['city']][0]}."})
        passages.append({"id": f"book-{p['index']}", "title": p["book"],
                         "text": f"{p['book']} is a novel written by {p['name']}."})
    for j, (city, country) in enumerate(cities):
        passages.append({"id": f"city-{j}", "title": city, "text": f"{city} is a city in {countries[country]}."})
    return {"passages": passages, "persons": persons, "cities": cities, "countries": countries}


def synthetic_questions(world_seed: int = 0, people: int = 60) -> list[dict]:
    """Two two-hop questions per author of the synthetic world, with answers and supporting passage ids."""
    world = synthetic_world(world_seed, people)
    cities, countries = world["cities"], world["countries"]
    questions = []
    for p in world["persons"]:
        city, country = cities[p["city"]][0], countries[cities[p["city"]][1]]
        questions.append({"id": f"q-{p['index']}-city",
                          "question": f"Which city was the author of {p['book']} born in?", "answer": city,
                          "supporting": [f"book-{p['index']}", f"person-{p['index']}"]})
        questions.append({"id": f"q-{p['index']}-country", "question": f"In which country was {p['name']} born?",
                          "answer": country, "supporting": [f"person-{p['index']}", f"city-{p['city']}"]})
    return questions


# -- BM25 -------------------------------------------------------------------------------------------

def load_corpus(path: str | Path) -> list[dict]:
    """Passages from a JSONL file of ``{"id", "title", "text"}`` objects (``title`` may be missing)."""
    passages = []
    try:
        lines = read_bytes(path).decode("utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise RetrievalError(f"cannot read corpus {str(path)!r}: {exc}") from None
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except (ValueError, RecursionError) as exc:  # ValueError: JSONDecodeError, or a too-long integer
            reason = exc.msg if isinstance(exc, json.JSONDecodeError) else (
                "nested too deeply" if isinstance(exc, RecursionError) else str(exc))
            raise RetrievalError(f"corpus {str(path)!r} line {number} is not JSON: {reason}") from None
        if not isinstance(row, dict) or not isinstance(row.get("text"), str):
            raise RetrievalError(f"corpus {str(path)!r} line {number} must be an object with a string 'text'")
        passages.append({"id": str(row.get("id", number)), "title": str(row.get("title", "")), "text": row["text"]})
    if not passages:
        raise RetrievalError(f"corpus {str(path)!r} holds no passages")
    return passages


def _index(corpus: str | None, world_seed: int, people: int) -> tuple[Any, list[dict]]:
    import bm25s

    logging.getLogger("bm25s").setLevel(logging.WARNING)  # bm25s sets its own logger to DEBUG

    if corpus is None:
        key: tuple = ("synthetic", world_seed, people)
    else:
        path = Path(corpus).resolve()
        try:
            stat = path.stat()
        except OSError as exc:
            raise RetrievalError(f"corpus {corpus!r} not found: {exc.strerror or exc}") from None
        key = (str(path), stat.st_size, stat.st_mtime_ns)
    with _LOCK:
        if key not in _INDEXES:
            passages = synthetic_world(world_seed, people)["passages"] if corpus is None else load_corpus(corpus)
            retriever = bm25s.BM25()
            tokens = bm25s.tokenize([f"{p['title']} {p['text']}" for p in passages], stopwords="en",
                                    show_progress=False)
            retriever.index(tokens, show_progress=False)
            _INDEXES[key] = (retriever, passages)
        return _INDEXES[key]


def _k(k: Any) -> int:
    try:
        value = int(k)
    except (TypeError, ValueError, OverflowError):  # OverflowError: k = inf
        raise RetrievalError(f"k must be an integer, got {k!r}") from None
    if not 1 <= value <= MAX_K:
        raise RetrievalError(f"k must be between 1 and {MAX_K}, got {value}")
    return value


def bm25_search(query: str, k: int = 3, corpus: str | None = None, world_seed: int = 0,
                people: int = 60) -> list[dict]:
    """The ``k`` best BM25 passages for ``query`` (score > 0), best first."""
    import bm25s

    k = _k(k)
    retriever, passages = _index(corpus, world_seed, people)
    tokens = bm25s.tokenize([str(query or "")], stopwords="en", return_ids=False, show_progress=False)
    if not tokens[0]:
        return []
    ids, scores = retriever.retrieve(tokens, k=min(k, len(passages)), show_progress=False, n_threads=1)
    return [{**passages[int(i)], "score": round(float(s), 4)} for i, s in zip(ids[0], scores[0]) if s > 0]


# -- HTTP retrieval server --------------------------------------------------------------------------

class _Retry(Exception):
    """A failure worth another attempt (timeout, connection error, HTTP 429 / 5xx)."""


def _post(url: str, body: bytes, timeout_s: float) -> Any:
    request = urllib.request.Request(url, data=body, method="POST",
                                     headers={"Content-Type": "application/json", "Accept": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:  # http(s) only: checked by the caller
            raw = response.read()
    except urllib.error.HTTPError as exc:
        message = f"HTTP {exc.code} {exc.reason}"
        if exc.code == 429 or exc.code >= 500:
            raise _Retry(message) from None
        raise RetrievalError(f"{url} answered {message}") from None
    except (TimeoutError, OSError) as exc:  # URLError is an OSError; socket.timeout is TimeoutError
        reason = getattr(exc, "reason", exc)
        if isinstance(reason, TimeoutError) or "timed out" in str(reason):
            raise _Retry(f"timed out after {timeout_s:g} s") from None
        raise _Retry(f"connection failed: {reason}") from None
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise RetrievalError(f"{url} answered malformed JSON: {str(exc)[:120]}") from None


def _passages(data: Any, url: str, k: int) -> list[dict]:
    """Accept a list of passages or an object holding one under results / passages / documents / docs."""
    if isinstance(data, dict):
        data = next((data[key] for key in ("results", "passages", "documents", "docs") if key in data), data)
    if not isinstance(data, list):
        raise RetrievalError(f"{url} answered {type(data).__name__}; expected a list of passages "
                             "(or {\"results\": [...]})")
    found = []
    for rank, item in enumerate(data[:k]):
        if isinstance(item, str):
            item = {"text": item}
        if not isinstance(item, dict) or not isinstance(item.get("text", item.get("contents")), str):
            raise RetrievalError(f"{url} answered a passage without a string 'text' at position {rank}")
        score = item.get("score")
        found.append({"id": str(item.get("id", rank)), "title": str(item.get("title", "")),
                      "text": item.get("text", item.get("contents")),
                      "score": float(score) if isinstance(score, (int, float)) else None})
    return found


async def http_search(query: str, k: int = 3, url: str | None = None, timeout_s: float = 5.0, retries: int = 2,
                      backoff_s: float = 0.5) -> list[dict]:
    """POST ``{"query", "k"}`` to ``url``; retried ``retries`` times with backoff ``backoff_s * 2**attempt``."""
    k = _k(k)
    if not isinstance(url, str) or not re.match(r"https?://", url):
        raise RetrievalError(f"http_search needs url: an http:// or https:// address, got {url!r}")
    if not (isinstance(timeout_s, (int, float)) and timeout_s > 0) or not (isinstance(retries, int) and retries >= 0):
        raise RetrievalError(f"timeout_s must be > 0 and retries >= 0, got {timeout_s!r} and {retries!r}")
    body = json.dumps({"query": str(query or ""), "k": k}).encode()
    problems = []
    for attempt in range(retries + 1):
        if attempt:
            await asyncio.sleep(backoff_s * 2 ** (attempt - 1))
        try:
            data = await asyncio.to_thread(_post, url, body, float(timeout_s))
        except _Retry as exc:
            problems.append(str(exc))
            continue
        return _passages(data, url, k)
    raise RetrievalError(f"POST {url} failed after {retries + 1} attempt(s): {'; '.join(problems)}")


# -- evidence ---------------------------------------------------------------------------------------

def _selected(selection: Any, count: int) -> list[int]:
    """1-based passage numbers named in a selector's output ("2", "1, 3", "[1][3]"), valid ones only.

    A digit run longer than :data:`MAX_SELECTION_DIGITS` names no passage and is skipped: ``int`` of it could
    pass Python's digit limit and raise. So is a string like ``"²"`` (``str.isdigit`` yet not a number).
    """
    items = selection if isinstance(selection, (list, tuple)) else DIGITS.findall(str(selection or ""))
    numbers = [item if isinstance(item, int) else int(item) for item in items
               if isinstance(item, int) or (isinstance(item, str) and len(item) <= MAX_SELECTION_DIGITS
                                            and DIGITS.fullmatch(item))]
    return list(dict.fromkeys(n for n in numbers if 1 <= n <= count))


def format_passages(passages: Any, selection: Any = None, max_chars: int = 600) -> str:
    """Numbered ``[i] title: text`` lines, each cut to an equal share of ``max_chars``.

    The title is left out when the text starts with it.

    ``selection`` keeps the passages it names (numbers as shown); when it names none, all are kept.
    ``passages`` that is not a list (a failed search gives None) yields ``(no passages)``.
    """
    if not isinstance(passages, list) or not passages:
        return "(no passages)"
    numbered = [(i, p) for i, p in enumerate(passages, start=1) if isinstance(p, dict)]
    chosen = _selected(selection, len(passages)) if selection is not None else []
    if chosen:
        numbered = [(i, p) for i, p in numbered if i in chosen]
    share = max(16, int(max_chars) // max(1, len(numbered)))
    lines = []
    for i, passage in numbered:
        title, text = str(passage.get("title", "")), str(passage.get("text", ""))
        body = text if not title or text.startswith(title) else f"{title}: {text}"
        line = f"[{i}] {body}".replace("\n", " ")
        lines.append(line if len(line) <= share else line[: share - 3].rstrip() + "...")
    return "\n".join(lines) or "(no passages)"


@unimas.hookimpl
def unimas_tools():
    return {"bm25_search": bm25_search, "http_search": http_search, "format_passages": format_passages}
