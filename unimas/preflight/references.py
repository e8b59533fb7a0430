"""Config fields that name something which must exist: a critic's model dir, a credit shaper's reward channels.

Each would otherwise pass ``validate`` and fail late or not at all: an empty
``critic.path`` (``Path("")`` is the working directory) failed only when the
group loaded, and a ``gdpo`` channel that no reward writes read as 0 for every
turn, so its share of the advantage was silently nothing.
"""

from __future__ import annotations

from pathlib import Path

from unimas.algorithms.credit import reward_keys
from unimas.config.schema import ExperimentConfig

CHANNEL_PARAMS = {"gdpo": "channels"}
"""Credit shaper -> its ``algorithm.credit.params`` entry that lists reward keys."""


def critic_path_problems(config: ExperimentConfig) -> list[tuple[str, str]]:
    """``models.<g>.critic.path``: when set, a local Hugging Face model dir (it is read, never downloaded)."""
    problems = []
    for name, group in config.models.items():
        path = group.critic.path if group.critic is not None else None
        if path is None:
            continue
        problem = _model_dir_problem(path)
        if problem is not None:
            problems.append((f"models.{name}.critic.path", problem))
    return problems


def _model_dir_problem(path: str) -> str | None:
    if not path.strip():
        return ("is empty; leave critic.path out (null) for a copy of the group's own backbone, or name the local "
                "directory of a Hugging Face model")
    if "\0" in path:
        return "contains a NUL character, which no file name can"
    try:
        root = Path(path)
        if not root.exists():
            return (f"{path!r} does not exist (a relative path is read from the config file's directory); name "
                    "the local directory of a Hugging Face model")
        if not (root / "config.json").is_file():
            return (f"{path!r} is not a Hugging Face model directory (no config.json in it); name the local "
                    "directory that holds config.json and the safetensors weights")
    except OSError as exc:
        return f"{path!r} cannot be read: {exc.strerror or exc}"
    return None


def credit_channel_problems(config: ExperimentConfig) -> list[tuple[str, str]]:
    """Every reward channel the credit shaper's params list must be a key some ``rewards`` entry writes."""
    credit = config.algorithm.credit
    param = CHANNEL_PARAMS.get(credit.name) if credit is not None else None
    channels = credit.params.get(param) if param is not None else None
    if not isinstance(channels, list):
        return []  # no such shaper, or the params check names what is wrong with the value
    written = reward_keys(config.rewards)
    unknown = [str(c) for c in channels if c not in written]
    if not unknown:
        return []
    return [(f"algorithm.credit.params.{param}", f"{', '.join(map(repr, unknown))}: no reward writes "
             f"{'this channel' if len(unknown) == 1 else 'these channels'}, so every turn would read 0 there; the "
             f"channels are the rewards' keys: {', '.join(written) or '(no rewards)'} (rewards[].name, or "
             "name#index when a name repeats)")]
