"""Token ids to text and back for whole batches, through a fast tokenizer's Rust backend when that
gives the same answer as transformers' wrapper.

Why: the wrapper around a fast tokenizer costs about 100 µs a call plus a
Python loop over the sequences (input checks, ``BatchEncoding``, one
``decode`` call per row). Profiled in ``benchmarks/overhead.py``, that was
about 0.6 ms of a 3-role step's framework overhead (three prompt batches
encoded, three answer batches decoded). The backend's batch calls return the
same ids and text whenever the wrapper would add nothing:

* encoding: the backend has no truncation or padding set (the wrapper turns
  both off before it encodes) and splits special tokens exactly as the
  wrapper's ``split_special_tokens`` says;
* decoding: the tokenizer does not ask for ``clean_up_tokenization_spaces``.

Otherwise, and for slow (pure-Python) tokenizers, the wrapper is called.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

from transformers import PreTrainedTokenizerBase


def _backend(tokenizer: PreTrainedTokenizerBase) -> Optional[Any]:
    return getattr(tokenizer, "backend_tokenizer", None) if getattr(tokenizer, "is_fast", False) else None


def encode_batch(tokenizer: PreTrainedTokenizerBase, texts: Sequence[str], add_special_tokens: bool) -> list[list[int]]:
    """The ids of each text, as ``tokenizer(texts, add_special_tokens=...)["input_ids"]`` gives them."""
    backend = _backend(tokenizer)
    if (backend is None or backend.truncation is not None or backend.padding is not None
            or backend.encode_special_tokens != bool(getattr(tokenizer, "split_special_tokens", False))):
        return tokenizer(list(texts), add_special_tokens=add_special_tokens)["input_ids"]
    encode = getattr(backend, "encode_batch_fast", backend.encode_batch)  # _fast: no character offsets computed
    return [encoding.ids for encoding in encode(list(texts), add_special_tokens=add_special_tokens)]


def decode_batch(tokenizer: PreTrainedTokenizerBase, rows: Sequence[Sequence[int]],
                 skip_special_tokens: bool = True) -> list[str]:
    """The text of each id row, as ``tokenizer.batch_decode(rows, skip_special_tokens=...)`` gives it."""
    backend = _backend(tokenizer)
    if backend is None or getattr(tokenizer, "clean_up_tokenization_spaces", False):
        return tokenizer.batch_decode([list(row) for row in rows], skip_special_tokens=skip_special_tokens)
    return backend.decode_batch([list(row) for row in rows], skip_special_tokens=skip_special_tokens)
