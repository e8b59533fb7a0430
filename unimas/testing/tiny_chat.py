"""A tiny chat model directory that loads, templates and follows its prompt like a real instruct model.

Char tokenizers and in-memory tiny models never exercise the code paths a
real checkpoint does: ``from_pretrained`` from a local dir, a byte-level BPE
tokenizer whose tokens do not line up with characters, special tokens, and
a Jinja chat template. :func:`build_chat_model` writes such a directory
offline in seconds, so tests, CPU examples and GPU checks use the
real loading, templating and parsing code without any download.

Choices (in the style of Qwen2.5-Instruct):

* a byte-level BPE (``tokenizers``) trained on a small generated corpus of
  words, numbers, arithmetic, letter answers, ``<answer>`` tags,
  ``\\boxed{}``, JSON and fenced code. Normalizer (NFC) and pre-tokenizer are
  Qwen2's own, because transformers 5 loads a ``qwen2`` dir with
  ``Qwen2Tokenizer``, which rebuilds exactly those around the saved vocab and
  merges; the saved ``tokenizer.json`` and the loaded tokenizer therefore
  agree. Every byte is in the alphabet, so any NFC text round-trips through
  encode/decode (decomposed text comes back composed, as with Qwen).
* special tokens ``<|endoftext|>`` (pad, id 0), ``<|im_start|>`` (1) and
  ``<|im_end|>`` (2, eos); no BOS. As in Qwen, ``split_special_tokens`` is
  off: user text that literally contains ``<|im_end|>`` encodes to the
  special token (the template inserts content raw).
* a ChatML template: ``<|im_start|>{role}\\n{content}<|im_end|>\\n`` per
  message, then ``<|im_start|>assistant\\n`` with ``add_generation_prompt``.
  Unlike Qwen, no default system message is added when none is given.
* a Qwen2 causal LM with untied embeddings and ``initializer_range`` 0.1,
  for the same reasons as :mod:`unimas.groups.hf.tiny`, then a few
  seconds of supervised "repeat: x" chat turns (:func:`instruct_tune`) so
  that it reads its prompt; ``instruct_steps=0`` keeps it purely random.

Token boundaries: special tokens are cut out before pre-tokenization, so
BPE never merges across them. Every message rendering starts with
``<|im_start|>``, hence tokenizing a whole conversation equals concatenating
the separately tokenized per-message renderings (and the generation
prompt). Inside ordinary text there is no such guarantee. After the
generation prompt's final ``\\n``, prompt ids plus completion ids equal the
ids of prompt + completion unless the completion starts with whitespace
holding a newline (the regex joins ``"\\n\\n"`` into one pre-token, and
it is one BPE token); and re-encoding decoded ids may give other ids
(``p r i n t`` comes back as ``print``). Token-exact traces keep sampled ids.

``--tool-calls`` builds the function-calling variant (:func:`tools_tune`):
given ``tools`` it answers with a Hermes ``<tool_call>`` block calling the
first listed function, given a tool result it answers with that result.

Run ``python -m unimas.testing.tiny_chat DIR [--hidden-size 768 --layers 12 --heads 12] [--tool-calls]``.
"""

from __future__ import annotations

import argparse
import functools
import os
import random
import shutil
import tempfile
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

PAD, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = (PAD, IM_START, IM_END)
# Qwen2's split: single digits, a punctuation char may lead a word, newlines kept together.
PRETOKENIZE_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                     r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

TOOLS_CHAT_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n"
    "{%- for m in messages if m['role'] == 'system' %}{{ m['content'] + '\n' }}{%- endfor %}"
    "tools:{% for t in tools %} {{ (t['function'] if 'function' in t else t)['name'] }}{% endfor %}<|im_end|>\n"
    "{%- endif %}"
    "{%- for m in messages if not (tools and m['role'] == 'system') %}<|im_start|>{{ m['role'] + '\n' }}"
    "{%- if m.get('tool_calls') %}{% for c in m['tool_calls'] %}<tool_call>\n"
    "{{- {'name': c['function']['name'], 'arguments': c['function']['arguments']} | tojson }}\n</tool_call>"
    "{%- endfor %}{% else %}{{ m['content'] or '' }}{% endif %}<|im_end|>\n"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}"
)
"""The ``--tool-calls`` model's template: ChatML, the function names in the system block (after any system
text, so a long system prompt cut from the left loses its start first), assistant calls as Hermes
``<tool_call>`` blocks, tool results as ``tool`` messages."""

TOOL_NAMES = ("add", "lookup", "search", "weather", "final_answer", "multiply", "echo", "count")
"""Function names the ``--tool-calls`` model is fitted on (any other name is copied less reliably)."""

_WORDS = (
    "the a an is are was of to and in on for with that this it as be by from at or not we you they "
    "answer question solve step first then next so therefore because final result number letter "
    "plan critic agent solver verifier code python json think check correct wrong sum total add "
    "subtract multiply divide equal value list count word task reply let us compute find given "
    "assistant user system tool call output input return print def if else while true false none"
).split()
_ROLES = ("system", "user", "assistant", "tool")
_LETTERS = "abcdefgh"


def _sentence(rng: random.Random) -> str:
    words = [rng.choice(_WORDS) for _ in range(rng.randint(3, 12))]
    words[0] = words[0].capitalize()
    return " ".join(words) + rng.choice(".?!:,")


def _line(rng: random.Random) -> str:
    """One line of the kinds of text that workflows and answer parsers emit."""
    a, b = rng.randint(0, 99), rng.randint(0, 99)
    op = rng.choice("+-*")
    value = {"+": a + b, "-": a - b, "*": a * b}[op]
    letter = rng.choice(_LETTERS)
    kind = rng.randrange(10)
    if kind == 0:
        return f"{a}{op}{b}={value}"
    if kind == 1:
        return f"{_sentence(rng)} {a} {op} {b} = {value}"
    if kind == 2:
        return f"<answer>{rng.choice([str(value), letter])}</answer>"
    if kind == 3:
        return f"The final answer is \\boxed{{{rng.choice([str(value), f'{a}/{b or 1}', letter])}}}."
    if kind == 4:
        return f'{{"{rng.choice(_WORDS)}": {value}, "answer": "{letter}", "ok": {rng.choice(["true", "false"])}}}'
    if kind == 5:
        return f"```python\ndef f(x):\n    return x {op} {b}\nprint(f({a}))\n```"
    if kind == 6:
        return f"{rng.choice(_ROLES)}\n{_sentence(rng)}"
    if kind == 7:
        return f"({letter}) {_sentence(rng)} Answer: {letter}"
    if kind == 8:
        return rng.choice(["\n", "\n\n"]).join(f"{i + 1}. {_sentence(rng)}" for i in range(rng.randint(2, 4)))
    return _sentence(rng) + rng.choice(["", "\n", "\n\n", "  "])


def generate_corpus(seed: int = 0, lines: int = 3000) -> list[str]:
    """A deterministic training corpus for the BPE (same seed, same lines)."""
    rng = random.Random(seed)
    return [_line(rng) for _ in range(lines)]


def build_tokenizer(vocab_size: int = 512, seed: int = 0, corpus: Iterable[str] | None = None,
                    max_positions: int = 512) -> Any:
    """A ``PreTrainedTokenizerFast`` with a byte-level BPE trained on ``corpus``."""
    from tokenizers import (
        Regex,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        trainers,
    )
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(list(corpus) if corpus is not None else generate_corpus(seed), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=None,
        eos_token=IM_END,
        pad_token=PAD,
        extra_special_tokens=[IM_START, IM_END],
        padding_side="left",
        clean_up_tokenization_spaces=False,
        split_special_tokens=False,
        model_max_length=max_positions,
        chat_template=CHAT_TEMPLATE,
    )


def parameters_for(hidden_size: int, num_layers: int, vocab_size: int, intermediate_size: int | None = None) -> int:
    """The parameter count of the Qwen2 model :func:`build_chat_model` makes (untied, full KV heads)."""
    h, inner = hidden_size, intermediate_size or 4 * hidden_size
    attention = 4 * h * h + 3 * h  # q, k, v, o weights; q, k, v biases
    layer = attention + 3 * h * inner + 2 * h  # gate, up, down; two RMSNorms
    return 2 * vocab_size * h + num_layers * layer + h


def build_model(tokenizer: Any, *, hidden_size: int = 64, num_layers: int = 2, num_heads: int = 4,
                max_positions: int = 512, seed: int = 0, intermediate_size: int | None = None) -> Any:
    """A float32 random-init Qwen2 LM sized to ``tokenizer``; same seed, same weights."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    if hidden_size % num_heads:
        raise ValueError(f"hidden_size {hidden_size} is not divisible by num_heads {num_heads}")
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        intermediate_size=intermediate_size or 4 * hidden_size,
        max_position_embeddings=max_positions,
        attention_dropout=0.0,
        initializer_range=0.1,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.bos_token_id = None
    return model


PROGRESS_EVERY = 100
"""Fitting steps between two progress lines."""

ONE_THREAD_UP_TO = 256
"""Widest ``hidden_size`` that :func:`build_chat_model` builds on one torch thread (see there)."""

INSTRUCT_VERBS = ("repeat", "say", "echo", "copy")
INSTRUCT_ITEMS = tuple("abcdefghijklmnopqrstuvwxyz0123456789")


def instruct_tune(model: Any, tokenizer: Any, steps: int, seed: int = 0, batch: int = 32, lr: float = 3e-3,
                  progress: Callable[[str], None] | None = None) -> None:
    """A few seconds of supervised chat turns ``"<verb>: x"`` -> ``x``, loss on the answer and ``<|im_end|>``.

    A random-init model ignores its prompt: the last positions of every chat
    prompt are the same template tokens, and RL alone does not find the way
    back to the user's words in a few hundred steps (measured on the chat
    quickstart: no progress in 400 steps). Real instruct models arrive able to
    follow their prompt; this gives the test model that ability, nothing more.
    """
    rng = random.Random(seed)

    @functools.cache  # 144 distinct turns; encoding each of the 9,600 drawn was a sixth of the build
    def encoded(verb: str, item: str) -> tuple[list[int], list[int]]:
        prompt = chat_ids(tokenizer, [{"role": "user", "content": f"{verb}: {item}"}], add_generation_prompt=True)
        return prompt, tokenizer(item + tokenizer.eos_token, add_special_tokens=False)["input_ids"]

    def example() -> tuple[list[int], list[int]]:
        item = rng.choice(INSTRUCT_ITEMS)
        return encoded(rng.choice(INSTRUCT_VERBS), item)

    supervised_steps(model, tokenizer, example, steps, seed, batch, lr, progress)


def tool_call_text(name: str) -> str:
    """The call block the ``--tool-calls`` model is fitted to answer with (Hermes format, no arguments)."""
    return '<tool_call>\n{"name": "' + name + '", "arguments": {}}\n</tool_call>'


def tool_corpus(seed: int = 0, lines: int = 400) -> list[str]:
    """Lines of tool lists and call blocks, so that the BPE has tokens for them."""
    rng = random.Random(seed)
    return [f"tools: {' '.join(rng.sample(TOOL_NAMES, 3))}\n{tool_call_text(rng.choice(TOOL_NAMES))}"
            for _ in range(lines)]


def tools_tune(model: Any, tokenizer: Any, steps: int, seed: int = 0, batch: int = 16, lr: float = 3e-3,
               progress: Callable[[str], None] | None = None) -> None:
    """Supervised turns that make a tiny model use tools: fitted, not sampled from a real instruct model.

    Three kinds, mixed: a request with ``tools`` is answered with a call of
    the first listed function (:func:`tool_call_text`); a conversation that
    ends with a ``tool`` result is answered with that result; a plain
    ``"repeat: x"`` is answered with ``x`` (as :func:`instruct_tune`). The
    calls the served model then makes are sampled from these weights.
    """
    rng = random.Random(seed)

    def example() -> tuple[list[int], list[int]]:
        tools = [{"type": "function", "function": {"name": n, "parameters": {}}}
                 for n in rng.sample(TOOL_NAMES, rng.randint(1, 3))]
        ask = {"role": "user", "content": f"{rng.choice(INSTRUCT_VERBS)}: {rng.choice(INSTRUCT_ITEMS)}"}
        kind = rng.randrange(3)
        if kind == 0:
            messages, answer = [ask], tool_call_text(tools[0]["function"]["name"])
        elif kind == 1:
            result = rng.choice(INSTRUCT_ITEMS)
            call = {"id": "c", "type": "function", "function": {"name": tools[0]["function"]["name"], "arguments": {}}}
            messages = [ask, {"role": "assistant", "content": "", "tool_calls": [call]},
                        {"role": "tool", "content": result, "tool_call_id": "c"}]
            answer = result
        else:
            messages, answer, tools = [ask], ask["content"].split(": ")[1], None
        if rng.random() < 0.3:
            messages = [{"role": "system", "content": _sentence(rng)}, *messages]
        prompt = chat_ids(tokenizer, messages, tools=tools, add_generation_prompt=True)
        return prompt, tokenizer(answer + tokenizer.eos_token, add_special_tokens=False)["input_ids"]

    supervised_steps(model, tokenizer, example, steps, seed, batch, lr, progress)


def supervised_steps(model: Any, tokenizer: Any, example: Any, steps: int, seed: int, batch: int, lr: float,
                     progress: Callable[[str], None] | None = None) -> None:
    """AdamW steps on batches of ``example()`` (prompt ids, answer ids) pairs, loss on the answers only."""
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
        model.train()
        for step in range(steps):
            pairs = [example() for _ in range(batch)]
            width = max(len(p) + len(a) for p, a in pairs)
            ids = torch.full((batch, width), tokenizer.pad_token_id)
            labels = torch.full((batch, width), -100)
            mask = torch.zeros((batch, width), dtype=torch.long)
            for row, (prompt, answer) in enumerate(pairs):
                sequence = prompt + answer
                ids[row, : len(sequence)] = torch.tensor(sequence)
                mask[row, : len(sequence)] = 1
                labels[row, len(prompt): len(sequence)] = torch.tensor(answer)
            loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if progress is not None and (step + 1) % PROGRESS_EVERY == 0:
                progress(f"  step {step + 1}/{steps}  loss {loss.item():.3f}")
        model.eval()


def build_chat_model(directory: os.PathLike | str, *, hidden_size: int = 64, num_layers: int = 2,
                     num_heads: int = 4, vocab_size: int = 512, max_positions: int = 512, seed: int = 0,
                     corpus: Iterable[str] | None = None, intermediate_size: int | None = None,
                     instruct_steps: int = 300, tool_calls: bool = False,
                     progress: Callable[[str], None] | None = None) -> Path:
    """Write tokenizer and model (safetensors) to ``directory`` with ``save_pretrained``; return it.

    ``instruct_steps``: supervised steps of :func:`instruct_tune` (0 = purely random weights).
    ``tool_calls``: a tools-aware template (:data:`TOOLS_CHAT_TEMPLATE`) and :func:`tools_tune` instead, so
    that, given tools, the model answers with a Hermes ``<tool_call>`` block, and given a tool result, with it.
    ``progress``: called with one line per stage and every 100 fitting steps.

    A model up to :data:`ONE_THREAD_UP_TO` wide is built on one torch thread:
    its matrices are tiny, so a second thread only adds synchronisation, and
    on a busy machine its spin-waits made the fit 20x slower (measured: 20
    steps in 1.1 s on one thread, 24 s on two, with other processes on both
    cores). It also fixes the reduction order, so the same arguments give the
    same bytes whatever ``torch.get_num_threads()`` the caller had. Wider
    models (``--hidden-size 768``) keep the caller's threads.
    """
    import torch

    directory = Path(directory)
    say = progress or (lambda message: None)
    if tool_calls and corpus is None:
        corpus = generate_corpus(seed) + tool_corpus(seed)
    threads = torch.get_num_threads()
    if hidden_size <= ONE_THREAD_UP_TO:
        torch.set_num_threads(1)
    try:
        say(f"training the byte-level BPE tokenizer (vocab {vocab_size})")
        tokenizer = build_tokenizer(vocab_size, seed, corpus, max_positions)
        if tool_calls:
            tokenizer.chat_template = TOOLS_CHAT_TEMPLATE
        model = build_model(tokenizer, hidden_size=hidden_size, num_layers=num_layers, num_heads=num_heads,
                            max_positions=max_positions, seed=seed, intermediate_size=intermediate_size)
        if instruct_steps:
            say(f"fitting {'tool-call' if tool_calls else 'repeat: x'} chat turns ({instruct_steps} steps, CPU)")
            (tools_tune if tool_calls else instruct_tune)(model, tokenizer, instruct_steps, seed, progress=say)
    finally:
        torch.set_num_threads(threads)
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(directory)
    model.save_pretrained(directory, safe_serialization=True)
    return directory


def chat_model_dir(tmp_root: os.PathLike | str, name: str = "tiny-chat", **options: Any) -> Path:
    """``tmp_root/name`` holding a default chat model, built only if it is not there yet.

    Built in a sibling temp dir and renamed, so a half-written dir (crash,
    parallel workers) is never mistaken for a finished one.
    """
    target = Path(tmp_root) / name
    if (target / "model.safetensors").exists():
        return target
    Path(tmp_root).mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=tmp_root))
    try:
        build_chat_model(staging, **options)
        try:
            staging.rename(target)
        except OSError:  # another worker finished first
            if not (target / "model.safetensors").exists():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def chat_ids(tokenizer: Any, messages: Sequence[dict], **kwargs: Any) -> list[int]:
    """Token ids of the rendered ``messages``; transformers 5 returns a ``BatchEncoding``, 4 a list."""
    out = tokenizer.apply_chat_template(list(messages), tokenize=True, **kwargs)
    ids = out["input_ids"] if hasattr(out, "keys") else out
    return list(ids)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m unimas.testing.tiny_chat", description=__doc__.splitlines()[0])
    parser.add_argument("directory", type=Path)
    parser.add_argument("--hidden-size", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--intermediate-size", type=int, default=None)
    parser.add_argument("--vocab-size", type=int, default=512)
    parser.add_argument("--max-positions", type=int, default=512)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--instruct-steps", type=int, default=300,
                        help="supervised 'repeat: x' chat steps so the model follows its prompt; 0 = random weights")
    parser.add_argument("--tool-calls", action="store_true",
                        help="a tools-aware template, fitted to answer requests with tools with a <tool_call> block")
    args = parser.parse_args(argv)
    print(f"building the test chat model in {args.directory} (offline, CPU)", flush=True)
    path = build_chat_model(args.directory, hidden_size=args.hidden_size, num_layers=args.layers,
                            num_heads=args.heads, vocab_size=args.vocab_size, max_positions=args.max_positions,
                            seed=args.seed, intermediate_size=args.intermediate_size,
                            instruct_steps=args.instruct_steps, tool_calls=args.tool_calls,
                            progress=lambda line: print(line, flush=True))
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(path, local_files_only=True)
    count = parameters_for(args.hidden_size, args.layers, config.vocab_size, args.intermediate_size)
    print(f"{path}  parameters={count:,} ({count / 1e6:.1f}M)  vocab={config.vocab_size}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
