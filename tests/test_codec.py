"""Batch encode/decode through the tokenizer backend gives exactly what transformers' wrapper gives
(``unimas/groups/hf/codec.py``), and falls back to the wrapper where the two would differ."""

import pytest

from unimas.groups.hf.chars import build_char_tokenizer
from unimas.groups.hf.codec import decode_batch, encode_batch
from unimas.testing.tiny_chat import IM_END, IM_START, build_tokenizer

TEXTS = ["hello world", "  two  spaces ", "", "naïve café ✓", f"{IM_START}user\nhi{IM_END}", "a , b ."]


@pytest.fixture(scope="module")
def bpe():
    return build_tokenizer(vocab_size=300)


@pytest.mark.parametrize("special", [True, False])
def test_ids_match_the_wrapper(bpe, special):
    assert encode_batch(bpe, TEXTS, add_special_tokens=special) == bpe(TEXTS, add_special_tokens=special)["input_ids"]
    chars = build_char_tokenizer("abc:")
    texts = ["a:b", "ccc", ""]
    assert encode_batch(chars, texts, add_special_tokens=special) == chars(texts, add_special_tokens=special)["input_ids"]


@pytest.mark.parametrize("skip", [True, False])
def test_text_matches_the_wrapper(bpe, skip):
    rows = bpe(TEXTS, add_special_tokens=True)["input_ids"] + [[], [bpe.pad_token_id, 5, bpe.eos_token_id]]
    assert decode_batch(bpe, rows, skip_special_tokens=skip) == bpe.batch_decode(rows, skip_special_tokens=skip)


def test_falls_back_where_the_wrapper_would_differ(bpe):
    """Truncation set on the backend (the wrapper clears it before encoding) and clean-up of spaces on decode."""
    bpe.backend_tokenizer.enable_truncation(max_length=2)
    try:
        assert encode_batch(bpe, TEXTS, add_special_tokens=False) == bpe(TEXTS, add_special_tokens=False)["input_ids"]
        assert max(map(len, encode_batch(bpe, TEXTS, add_special_tokens=False))) > 2
    finally:
        bpe.backend_tokenizer.no_truncation()
    rows = bpe(["a , b ."], add_special_tokens=False)["input_ids"]
    bpe.clean_up_tokenization_spaces = True
    bpe.clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output = True
    try:
        cleaned = bpe.batch_decode(rows, skip_special_tokens=True)
        assert cleaned == ["a, b."]  # the wrapper's clean-up changed the text, so the backend alone would differ
        assert decode_batch(bpe, rows) == cleaned
    finally:
        bpe.clean_up_tokenization_spaces = False
