"""Process-wide set-up that every unimas process doing model work applies once (driver and Ray actors)."""

from __future__ import annotations


def torch_setup(threads: int, seed: int) -> None:
    """Thread count, the global torch seed (only LoRA dropout draws from it), no HF progress bars."""
    import torch  # heavy: imported by processes that load models, not by `import unimas`
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    torch.set_num_threads(threads)
    torch.manual_seed(seed)
