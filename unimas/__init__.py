"""unimas: train LLM multi-agent systems with reinforcement learning."""

import pluggy

__version__ = "0.1.0"

hookimpl = pluggy.HookimplMarker("unimas")

__all__ = ["hookimpl", "__version__"]
