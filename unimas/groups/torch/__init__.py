"""The in-process PyTorch backend (``backend: torch``); see :mod:`unimas.groups.torch.group`."""

from unimas.groups.torch.group import TorchModelGroup
from unimas.groups.torch.options import TinyModelConfig, TorchOptions
from unimas.groups.torch.training import SupervisedExample

__all__ = ["SupervisedExample", "TinyModelConfig", "TorchModelGroup", "TorchOptions"]
