"""Ready-made workflows and the datasets they come with."""

import unimas
from unimas_workflows.arithmetic import arithmetic_tasks, solver_verifier
from unimas_workflows.plan_path import grid_walk, path_solved, plan_path, plan_path_tasks
from unimas_workflows.shapes import WORKFLOWS as SHAPES
from unimas_workflows.shapes import arithmetic_sums, role_score
from unimas_workflows.signalling import signalling, signalling_tasks


@unimas.hookimpl
def unimas_workflows():
    return {"signalling": signalling, "solver_verifier": solver_verifier, **SHAPES, "plan_path": plan_path}


@unimas.hookimpl
def unimas_datasets():
    return {"signalling": signalling_tasks, "arithmetic": arithmetic_tasks, "arithmetic_sums": arithmetic_sums,
            "plan_path": plan_path_tasks}


@unimas.hookimpl
def unimas_rewards():
    return {"role_score": role_score, "path_solved": path_solved}


@unimas.hookimpl
def unimas_tools():
    return {"grid_walk": grid_walk}
