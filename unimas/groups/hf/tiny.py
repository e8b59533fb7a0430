"""Random-init causal LMs built from a :class:`TinyModelConfig`.

Tiny models make every unimas experiment runnable on a laptop CPU with no
download. Two defaults differ from Hugging Face's on purpose (see
``cpu-training-notes.md``): ``initializer_range`` is the config's ``init_std``
(0.1; HF's 0.02 gives near-symmetric outputs that RL cannot break) and input
and output embeddings are untied (tied ones let greedy decoding copy the
prompt and fake a solved task). Dropout is off so that training-time
log-probs equal sampling-time ones.
"""

from __future__ import annotations

import torch
from transformers import (
    AutoModelForCausalLM,
    GPT2Config,
    LlamaConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    Qwen2Config,
)

from unimas.groups.hf.model_source import TinyModelConfig


def tiny_model_config(cfg: TinyModelConfig, tokenizer: PreTrainedTokenizerBase):
    """The Hugging Face config for ``cfg`` with vocab and special ids from ``tokenizer``."""
    ids = dict(
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
        initializer_range=cfg.init_std,
        tie_word_embeddings=cfg.tie_embeddings,
    )
    inner = cfg.intermediate_size or 4 * cfg.hidden_size
    if cfg.architecture == "gpt2":
        return GPT2Config(
            n_embd=cfg.hidden_size,
            n_layer=cfg.num_layers,
            n_head=cfg.num_heads,
            n_inner=inner,
            n_positions=cfg.max_positions,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            **ids,
        )
    config_cls = Qwen2Config if cfg.architecture == "qwen2" else LlamaConfig
    return config_cls(
        hidden_size=cfg.hidden_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_heads,
        intermediate_size=inner,
        max_position_embeddings=cfg.max_positions,
        attention_dropout=0.0,
        **ids,
    )


def build_tiny_model(cfg: TinyModelConfig, tokenizer: PreTrainedTokenizerBase, seed: int) -> PreTrainedModel:
    """A float32 random-init causal LM; the same ``seed`` gives the same weights.

    The global torch RNG is forked, so building a model does not disturb
    anybody else's random stream.
    """
    config = tiny_model_config(cfg, tokenizer)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model
