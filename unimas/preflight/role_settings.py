"""Checks of the per-role loss settings (``roles.<role>.entropy_coef`` / ``loss_weight``, docs/credit.md)."""

from __future__ import annotations

from unimas.config.schema import ExperimentConfig


def role_objective_problems(config: ExperimentConfig) -> list[tuple[str, str]]:
    """A per-role loss setting on a role that is never trained would silently do nothing: refuse it."""
    problems = []
    for name, role in config.roles.items():
        group = config.models.get(role.model)
        trained = role.trainable and group is not None and group.trainable
        for key, default in (("entropy_coef", None), ("loss_weight", 1.0)):
            if getattr(role, key) != default and not trained:
                problems.append((f"roles.{name}.{key}", f"role '{name}' is not trained (a frozen role or model "
                                 f"group), so its {key} would change nothing; drop it or make the role trainable"))
    return problems


def role_objective_lines(config: ExperimentConfig) -> list[str]:
    """What `unimas validate` prints under the loss for roles with their own terms (none: no line)."""
    parts = []
    for name, role in config.roles.items():
        terms = ([f"entropy {role.entropy_coef:g}"] if role.entropy_coef is not None else []) + (
            [f"loss weight {role.loss_weight:g}"] if role.loss_weight != 1.0 else [])
        if terms:
            parts.append(f"{name} {', '.join(terms)}")
    return [f"  per role: {'; '.join(parts)}"] if parts else []
