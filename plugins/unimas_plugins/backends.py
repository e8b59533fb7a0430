"""Built-in backends: `torch` (transformers + torch + peft, CPU or GPU), `openai` (frozen API roles) and
`verl` (verl's FSDP2 engine; see docs/verl.md).

Each name maps to the backend class itself: its ``options`` model validates
``models.<group>.options`` and its ``build`` classmethod makes the group. The
classes are :class:`unimas.Deferred`: their modules import torch,
transformers or verl, which ``unimas plugins`` has no use for; the registry
imports one when a config names it.
"""

import unimas


@unimas.hookimpl
def unimas_backends():
    return {"torch": unimas.Deferred("unimas.groups.torch.backend", "TorchBackend"),
            "openai": unimas.Deferred("unimas.groups.openai", "OpenAIModelGroup"),
            "verl": unimas.Deferred("unimas.groups.verl.group", "VerlModelGroup")}
