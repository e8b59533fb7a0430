"""``backend: torch`` as the plugin registry holds it: what checking a config asks, without the modelling code.

``unimas validate`` asks a backend for its options model, whether it trains and
has critics, its token strings (for the prompt check and the stand-in model of
``--episodes``) and whether it renders chat templates. For a tiny model all of
that follows from the options alone: its char tokenizer's tokens are the
alphabet (:mod:`unimas.groups.hf.chars`), and it has no chat template. A
model dir or a checkpoint answers from its tokenizer files
(:mod:`unimas.groups.hf.tokenizer_files`). So this class answers without
importing torch or transformers (whose tokenizer classes alone cost seconds:
docs/performance.md, start-up), except for a dir without ``tokenizer.json``,
whose tokenizer transformers loads. :meth:`build` imports
:class:`~unimas.groups.torch.group.TorchModelGroup` and makes the group.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Optional

from unimas.groups.torch.options import TorchOptions

if TYPE_CHECKING:
    from unimas.groups.base import GroupSpec
    from unimas.groups.torch.group import TorchModelGroup


class TorchBackend:
    options: ClassVar[type[TorchOptions]] = TorchOptions
    supports_critic: ClassVar[bool] = True
    """``models.<group>.critic`` works here (docs/critic.md)."""

    @staticmethod
    def build(spec: "GroupSpec") -> "TorchModelGroup":
        from unimas.groups.torch.group import TorchModelGroup

        return TorchModelGroup.build(spec)

    @staticmethod
    def vocabulary(options: object) -> Optional[list[str]]:
        """Token texts in id order, special tokens left out: a tiny model's alphabet, else its tokenizer's."""
        options = options if isinstance(options, TorchOptions) else TorchOptions.model_validate(options)
        if options.tiny is not None:
            return [char for char in dict.fromkeys(options.tiny.alphabet) if char]
        from unimas.groups.hf import source

        return source.vocabulary(options)

    @staticmethod
    def has_chat_template(options: object) -> Optional[bool]:
        """Whether roles on this group render through a chat template; a tiny model's char tokenizer has none."""
        options = options if isinstance(options, TorchOptions) else TorchOptions.model_validate(options)
        if options.tiny is not None:
            return False
        from unimas.groups.hf import source

        return source.has_chat_template(options)
