"""Which rows a forward sees: turns laid out as a batch (split or full rows, remembered once) and the
mini-batch orders of an update.

Kept apart from the policy and the learner because both read it: the
learner owns one :class:`TurnBatches` (its batch cache) and hands it to the
policy's log-prob forwards and to the critic's value forwards, so a
mini-batch's reference pass, policy pass and critic pass lay its turns out
once.
"""

from __future__ import annotations

import operator
from typing import Iterator, Optional, Sequence

import torch

from unimas.groups.base import TrainTurn
from unimas.groups.hf.layout import PaddedBatch, layout_batch
from unimas.groups.hf.shared_prompts import SplitBatch, split_batch, split_forward


class TurnBatches:
    """The batch of exactly these turn objects, remembered once: a mini-batch's policy pass reuses the batch its
    reference pass built, and neither decides the split again. Only batches built outside inference mode are
    remembered (an inference tensor cannot enter a later pass that records gradients)."""

    def __init__(self, pad_id: int, device: torch.device):
        self.pad_id = pad_id
        self.device = device
        self._remembered: Optional[tuple[list[TrainTurn], PaddedBatch | SplitBatch]] = None

    def __call__(self, turns: Sequence[TrainTurn]) -> PaddedBatch | SplitBatch:
        """Split (:meth:`split`) when sharing the turns' prompts pays, else :meth:`full_rows`."""
        remembered = self._remembered
        if remembered is not None and len(remembered[0]) == len(turns) and all(map(operator.is_, remembered[0],
                                                                                      turns)):
            return remembered[1]
        batch = self.split(turns) or self.full_rows(turns)
        if not torch.is_inference_mode_enabled():
            self._remembered = (list(turns), batch)
        return batch

    def forget(self) -> None:
        """Drop the remembered batch (its tensors stay alive until then)."""
        self._remembered = None

    def split(self, turns: Sequence[TrainTurn]) -> Optional[SplitBatch]:
        """The turns as a :class:`SplitBatch` when :func:`split_forward` says sharing their prompts pays, else None."""
        if not all(t.response_ids for t in turns):
            return None
        plan = split_forward([t.prompt_ids for t in turns])
        if plan is None:
            return None
        return split_batch(*plan, [t.response_ids for t in turns], self.pad_id, self.device)

    def full_rows(self, turns: Sequence[TrainTurn]) -> PaddedBatch:
        """The turns as one ``[prompt | response]`` row each."""
        return layout_batch([t.prompt_ids for t in turns], [t.response_ids for t in turns], self.pad_id, self.device)


def minibatches(count: int, size: int, epochs: int, generator: torch.Generator) -> Iterator[list[int]]:
    """Row indices of each mini-batch, epoch after epoch: in order when one batch holds all rows, else shuffled by
    ``generator`` (the group's, saved with checkpoints, so a resumed run draws the same orders)."""
    for _ in range(epochs):
        order = list(range(count))
        if size < count:
            order = torch.randperm(count, generator=generator, device=generator.device).tolist()
        for begin in range(0, count, size):
            yield order[begin: begin + size]
