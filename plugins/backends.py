"""Built-in backends: `torch` (transformers + torch + peft, CPU or GPU) and `openai` (frozen API roles)."""

import unimas


@unimas.hookimpl
def unimas_backends():
    from unimas.backends.openai_backend import OpenAIModelGroup
    from unimas.backends.torch_backend import TorchModelGroup

    return {"torch": TorchModelGroup.from_config, "openai": OpenAIModelGroup.from_config}
