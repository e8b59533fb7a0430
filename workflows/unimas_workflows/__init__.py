"""Ready-made workflows and the datasets they come with."""

import unimas
from unimas_workflows.arithmetic import arithmetic_tasks, solver_verifier
from unimas_workflows.signalling import signalling, signalling_tasks


@unimas.hookimpl
def unimas_workflows():
    return {"signalling": signalling, "solver_verifier": solver_verifier}


@unimas.hookimpl
def unimas_datasets():
    return {"signalling": signalling_tasks, "arithmetic": arithmetic_tasks}
