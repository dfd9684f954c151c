"""DAG scheduling rules (Argo's `dag.go`): when a task may start, and when a DAG is done.

`results` map a task name to its phase (None until it is started or decided).
"""

from __future__ import annotations

from deployments.spec.model import Task, Template
from deployments.workflow import expressions

WAIT = "wait"
OMIT = "omit"
RUN = "run"

_FINISHED = {"Succeeded", "Failed", "Errored", "Skipped", "Omitted"}


def depends_text(task: Task, tasks: dict[str, Task]) -> str | None:
    """The task's depends expression; `dependencies` are rewritten into one (Argo does too)."""
    if task.depends:
        return task.depends
    if task.dependencies:
        continue_on = {name: tasks[name].continue_on for name in task.dependencies if name in tasks}
        return expressions.depends_from_dependencies(task.dependencies, continue_on)
    return None


def decide(
    task: Task, results: dict[str, str | None], groups: dict[str, list[str]], tasks=None
) -> str:
    """WAIT until every dependency has finished; then RUN, or OMIT when depends is false."""
    tasks = tasks or {}
    text = depends_text(task, tasks)
    if text is None:
        return RUN
    # A bare name in depends picks up that task's continueOn, as in `dependencies`.
    parsed = expressions.parse_depends(
        text, continue_on={name: t.continue_on for name, t in tasks.items()}
    )
    names = parsed.task_names()
    if any(results.get(name) not in _FINISHED for name in names):
        return WAIT
    finished = {name: results[name] for name in names}
    return RUN if parsed.evaluate(finished, groups) else OMIT


def _covered(task: Task, phase: str | None) -> bool:
    if phase == "Failed":
        return bool(task.continue_on.get("failed"))
    if phase == "Errored":
        return bool(task.continue_on.get("error"))
    return True


def has_uncovered_failure(tasks: dict[str, Task], results: dict[str, str | None]) -> bool:
    """Whether a task failed or errored without continueOn covering it (failFast stops here)."""
    return any(
        results[name] in {"Failed", "Errored"} and not _covered(task, results[name])
        for name, task in tasks.items()
    )


def outcome(
    template: Template, tasks: dict[str, Task], results: dict[str, str | None]
) -> tuple[str, str] | None:
    """The DAG's (phase, first failed task) once nothing more can run; None while it still runs."""
    running = [n for n, phase in results.items() if phase is not None and phase not in _FINISHED]
    if running:
        return None
    failed = [
        name
        for name, task in tasks.items()
        if results[name] in {"Failed", "Errored"} and not _covered(task, results[name])
    ]
    if failed and template.fail_fast:
        return "Failed", failed[0]
    if any(phase is None for phase in results.values()):
        return None  # tasks not decided yet (their dependencies are still running)
    if failed:
        return "Failed", failed[0]
    return "Succeeded", ""
