"""DAG scheduling rules (Argo's `dag.go`): which tasks run, when each may start, and when the
DAG is done.

`results` map a task name to its phase (None until it is started or decided). Only the
DAG's targets (`dag.target`, by default its leaves) and the tasks they depend on run. The
DAG's phase is its targets' branch phases: a target that was omitted inherits a failure
from the tasks it depends on, so a failure a later task handled (`depends: "a.Failed"`)
does not fail the DAG, and one nobody handled does.
"""

from __future__ import annotations

import functools

from deployments.spec.model import Task, Template
from deployments.workflow import expressions

WAIT = "wait"
OMIT = "omit"
RUN = "run"

_FINISHED = {"Succeeded", "Failed", "Errored", "Skipped", "Omitted"}
_FAILED = {"Failed", "Errored"}


def depends_text(task: Task, tasks: dict[str, Task]) -> str | None:
    """The task's depends expression; `dependencies` are rewritten into one (Argo does too)."""
    if task.depends:
        return task.depends
    if task.dependencies:
        continue_on = {name: tasks[name].continue_on for name in task.dependencies if name in tasks}
        return expressions.depends_from_dependencies(task.dependencies, continue_on)
    return None


def _parsed(task: Task, tasks: dict[str, Task]) -> expressions.DependsExpression | None:
    text = depends_text(task, tasks)
    if text is None:
        return None
    # A bare name in depends picks up that task's continueOn, as in `dependencies`.
    continue_on = tuple(
        (name, tuple(sorted(t.continue_on.items()))) for name, t in tasks.items() if t.continue_on
    )
    return _parse(text, continue_on)


@functools.lru_cache(maxsize=4096)
def _parse(text: str, continue_on: tuple) -> expressions.DependsExpression:
    """Parsed once per expression: the engine asks on every move of every run."""
    return expressions.parse_depends(text, continue_on={k: dict(v) for k, v in continue_on})


def dependency_names(task: Task, tasks: dict[str, Task]) -> list[str]:
    """The tasks `task` waits for, in the order the DAG lists them."""
    parsed = _parsed(task, tasks)
    names = parsed.task_names() if parsed is not None else set()
    return [name for name in tasks if name in names]


def targets(tasks: dict[str, Task], target: list[str] | None) -> list[str]:
    """The target tasks: those named by `dag.target`, else every task nothing depends on."""
    if target:
        return list(target)
    depended_on = {dep for task in tasks.values() for dep in dependency_names(task, tasks)}
    return [name for name in tasks if name not in depended_on]


def needed(target_names: list[str], tasks: dict[str, Task]) -> set[str]:
    """The targets and every task they depend on, directly or not: the tasks that run."""
    result: set[str] = set()
    pending = list(target_names)
    while pending:
        name = pending.pop()
        if name in result or name not in tasks:
            continue
        result.add(name)
        pending.extend(dependency_names(tasks[name], tasks))
    return result


def decide(
    task: Task, results: dict[str, str | None], groups: dict[str, list[str]], tasks=None
) -> str:
    """WAIT until every dependency has finished; then RUN, or OMIT when depends is false."""
    tasks = tasks or {}
    parsed = _parsed(task, tasks)
    if parsed is None:
        return RUN
    names = parsed.task_names()
    if any(results.get(name) not in _FINISHED for name in names):
        return WAIT
    finished = {name: results[name] for name in names}
    return RUN if parsed.evaluate(finished, groups) else OMIT


def branch(
    name: str, tasks: dict[str, Task], results: dict[str, str | None]
) -> tuple[str | None, str]:
    """The phase of the branch ending at `name`, and the task a failure came from.

    A task that ran (or was skipped) gives its own phase. An omitted task inherits from the
    tasks it depends on, a failure first (Argo's assessDAGPhase). None while undecided.
    """
    phase = results.get(name)
    if phase is None or phase not in _FINISHED:
        return None, ""
    if phase != "Omitted":
        return phase, name if phase in _FAILED else ""
    inherited: tuple[str | None, str] = ("Succeeded", "")
    for dep in dependency_names(tasks[name], tasks):
        dep_phase, origin = branch(dep, tasks, results)
        if dep_phase in _FAILED:
            return dep_phase, origin
        if dep_phase is not None:
            inherited = (dep_phase, origin)
    return inherited


def _covered(task: Task, phase: str | None) -> bool:
    if phase == "Failed":
        return bool(task.continue_on.get("failed"))
    if phase == "Errored":
        return bool(task.continue_on.get("error"))
    return True


def failed_target(
    target_names: list[str], tasks: dict[str, Task], results: dict[str, str | None]
) -> str | None:
    """The task behind the first target whose branch failed without continueOn, if any."""
    for name in target_names:
        phase, origin = branch(name, tasks, results)
        if phase in _FAILED and not _covered(tasks[name], phase):
            return origin or name
    return None


def outcome(
    template: Template,
    tasks: dict[str, Task],
    results: dict[str, str | None],
    target_names: list[str],
) -> tuple[str, str] | None:
    """The DAG's (phase, task a failure came from) once it is decided; None while it runs.

    Running tasks always finish first. With failFast a failed target branch decides the DAG
    even while other targets are undecided (they will not start); without it every target
    must be decided.
    """
    if any(phase is not None and phase not in _FINISHED for phase in results.values()):
        return None
    failed = failed_target(target_names, tasks, results)
    undecided = any(branch(name, tasks, results)[0] is None for name in target_names)
    if failed is not None and (template.fail_fast or not undecided):
        return "Failed", failed
    if undecided:
        return None
    return "Succeeded", ""
