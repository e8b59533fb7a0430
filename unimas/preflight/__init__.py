"""Reading a config against the installed plugins and backends without training.

``validate`` (``unimas validate``) and ``dry_run`` (``unimas train
--dry-run``) check a config end to end; ``config_reference`` and
``algorithm_reference`` generate docs/config.md and ``unimas algorithms``
from the schema and the registry. They sit above the training layer
because they build what it builds, on paper.

May import: algorithms, config, contract, controller, errors, groups, report, runtime, training, trajectory, workflow.
"""
