"""Built-in backends: `torch` (transformers + torch + peft, CPU or GPU) and `openai` (frozen API roles).

Each name maps to the backend class itself: its ``options`` model validates
``models.<group>.options`` and its ``build`` classmethod makes the group.
"""

import unimas


@unimas.hookimpl
def unimas_backends():
    from unimas.groups.openai import OpenAIModelGroup
    from unimas.groups.torch import TorchModelGroup

    return {"torch": TorchModelGroup, "openai": OpenAIModelGroup}
