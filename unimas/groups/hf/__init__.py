"""Hugging Face models as both model backends use them: loading, tokenizers, chat rendering, KV-cache sampling.

Where a group's weights and tokenizer come from (:mod:`.model_source`, :mod:`.source`, :mod:`.pretrained`,
:mod:`.tokenizer_files`, the tiny char-level models of :mod:`.chars` and :mod:`.tiny`), how a request's
messages become prompt ids (:mod:`.chat`), how rows are laid out and sampled with a KV cache
(:mod:`.layout`, :mod:`.shared_prompts`, :mod:`.sampling`, :mod:`.codec`). The torch backend trains with
them and the verl backend's in-process rollout samples with them, so a role renders and samples the same
on either; neither backend's own modules live here. This package init imports nothing.
"""
