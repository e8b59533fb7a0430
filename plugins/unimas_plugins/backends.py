"""Built-in backends: `torch` (transformers + torch + peft, CPU or GPU), `openai` (frozen API roles) and
`verl` (verl's FSDP2 engine; see docs/verl.md).

Each name maps to the backend class itself: its ``options`` model validates
``models.<group>.options`` and its ``build`` classmethod makes the group.
"""

import unimas


@unimas.hookimpl
def unimas_backends():
    from unimas.groups.openai import OpenAIModelGroup
    from unimas.groups.torch import TorchModelGroup
    from unimas.groups.verl.group import VerlModelGroup

    return {"torch": TorchModelGroup, "openai": OpenAIModelGroup, "verl": VerlModelGroup}
