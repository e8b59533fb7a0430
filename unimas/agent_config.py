"""The ``workflow.agent`` config section, apart from unimas/config.py to keep that module short.

It imports nothing from unimas, so unimas/config.py can import it without a cycle.
"""

from __future__ import annotations

from typing import Optional

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, model_validator


class AgentConfig(BaseModel):
    """An existing agent program trained through the OpenAI-compatible gateway (docs/gateway.md).

    Per episode it gets the task and a base URL whose ``/chat/completions``
    turns ``model: <role>`` into a turn of that role.
    """

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)  # as unimas.config.Strict

    command: Optional[list[str]] = Field(None, description="program run per episode (cwd = where unimas runs): task "
                                         "JSON on stdin, OPENAI_BASE_URL / OPENAI_API_KEY in its environment, "
                                         "outcome JSON object as the last line of stdout")
    function: Optional[str] = Field(None, description="`pkg.module:run`, an `async def run(task, base_url) -> dict` "
                                    "called per episode in the trainer's process")
    timeout_s: float = Field(300.0, gt=0, description="an agent running longer is stopped and its episode fails")
    host: str = Field("127.0.0.1", description="gateway address; wherever it listens, a `command` agent's "
                      "requests need its episode's own token (given to it as OPENAI_API_KEY); a `function` agent "
                      "needs a loopback address")
    port: int = Field(0, ge=0, le=65535, description="gateway port; 0 = a free port")
    _config_dir: Optional[str] = PrivateAttr(None)
    """The directory of the config file (set when loaded from one): `function` modules are also looked up there."""

    @model_validator(mode="after")
    def _one_kind(self) -> "AgentConfig":
        if (self.command is None) == (self.function is None):
            raise ValueError("give exactly one of 'command' (a program) or 'function' (pkg.module:run)")
        if self.command is not None and not self.command:
            raise ValueError("'command' is empty: give the program and its arguments, e.g. [python, agent.py]")
        if self.function is not None and ":" not in self.function:
            raise ValueError(f"'function' {self.function!r} must look like pkg.module:run")
        return self
