"""The one exception type the CLI turns into exit code 2.

Everything a user can get wrong (config, plugin names, workflow graphs, data
files) raises :class:`UserError` with a message that names the field or file
and says how to fix it, so the CLI never has to show a traceback for it.
"""


class UserError(Exception):
    """A mistake in user input: reported as one paragraph, exit code 2."""

    def __init__(self, message: str, *, where: str | None = None):
        self.where = where
        super().__init__(f"{where}: {message}" if where else message)


class RunError(RuntimeError):
    """The run cannot go on (not a config mistake): the CLI prints one line and exits 1."""


class ModelGroupError(RunError):
    """A model group (process, actor or endpoint) failed."""
