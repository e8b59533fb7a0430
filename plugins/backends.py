"""The built-in `torch` backend: transformers + torch + peft, CPU or GPU."""

import unimas


@unimas.hookimpl
def unimas_backends():
    from unimas.backends.torch_backend import TorchModelGroup

    return {"torch": TorchModelGroup.from_config}
