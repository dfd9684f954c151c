"""`python -m bench.evaluator SPEC`: what bounding CEL and jq costs per evaluation.

Conditions are evaluated on every move of a waiting resource task, so the evaluator child
(`deployments/workflow/evaluator.py`) must add little to each. This prints µs for one condition
alone and for one move's failure and success conditions, in this process (celpy directly, as
before the child existed) and through the child, and the overhead per evaluation; the same for
a jq output.

What is evaluated comes from the spec: the CEL conditions of the first object its create waits
on, over that object as the sandbox's simulated operators leave it — the create is run on an
in-process sandbox (`plan.Create.run`) and the object read back once its successCondition
holds. The jq filter is the spec's first jq output, else `.status | keys`. "changed object"
alternates two versions of the object, as watch events bring them (the child converts the
object once per move); "same object" is a safety-net poll of an unchanged one. Figures are
printed, never asserted. No Django: the engine and the sandbox are plain Python.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import celpy
import jq

from deployments.workflow import evaluator
from deployments.workflow.conditions import CEL_PREFIX

from .plan import Create
from .support import BenchError, figures_record

ROUNDS = 400  # calls per batch (`--rounds`)
REPEATS = 5
SPEED = 2000.0  # the sandbox's time factor while the sample object is made
SAMPLE_TIMEOUT = 120.0
DEFAULT_JQ = ".status | keys"


def sample(create: Create) -> tuple[dict[str, Any], str | None, str | None]:
    """The first object the create waits on, once its successCondition holds on a sandbox with
    the simulated operators, and that object's success and failure conditions."""
    import yaml

    from deployments.kube import KubeDriver, api_client_from_kubeconfig
    from sandbox import Sandbox

    with Sandbox(speed=SPEED) as sandbox, tempfile.TemporaryDirectory() as tmp:
        kubeconfig = yaml.safe_dump(sandbox.kubeconfig())
        driver = KubeDriver(
            api_client_from_kubeconfig(kubeconfig), cache_file=str(Path(tmp) / "d.json")
        )
        try:
            instance_id = create.run(driver, deadline=time.monotonic() + SAMPLE_TIMEOUT)
            step = create.waits[0]
            obj, success, failure = create.render(step, create.context(instance_id), instance_id)
            return driver.get(obj), success, failure
        finally:
            driver.close()


def _cel(condition: str | None) -> str | None:
    """The CEL expression of a `cel:` condition (None for a label-selector one, or none)."""
    text = (condition or "").strip()
    return text[len(CEL_PREFIX) :].strip() if text.startswith(CEL_PREFIX) else None


def _jq_filter(create: Create) -> str:
    for verb in create.spec.main.verbs.values():
        for template in verb.workflow.templates.values():
            for output in template.outputs:
                if output.jq_filter:
                    return output.jq_filter
    return DEFAULT_JQ


def _per_call_us(
    call: Callable[[dict[str, Any]], Any], objects: list[dict[str, Any]], rounds: int
) -> float:
    """µs per call, the best of REPEATS batches of `rounds`: the machine's other load only adds
    time."""
    for obj in objects * min(50, rounds):  # warm up: the child started, programs compiled
        call(obj)
    best = float("inf")
    for _ in range(REPEATS):
        start = time.perf_counter()
        for i in range(rounds):
            call(objects[i % len(objects)])
        best = min(best, time.perf_counter() - start)
    return best / rounds * 1e6


def _cel_program(expression: str) -> celpy.Runner:
    environment = celpy.Environment()
    return environment.program(environment.compile(expression))


def _row(label: str, inside: float, child: float, evaluations: int) -> float:
    overhead = (child - inside) / evaluations
    print(f"  {label:<44} {inside:9.0f} {child:10.0f} {overhead:+14.0f}")
    return overhead


def main(argv: list[str] | None = None) -> None:
    """Print µs in-process and through the evaluator child, and the overhead per evaluation."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.evaluator",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("spec", type=Path, help="the plan spec whose conditions are evaluated")
    parser.add_argument(
        "--rounds", type=int, default=ROUNDS, help=f"calls per batch (default {ROUNDS})"
    )
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be positive")
    rounds = args.rounds
    try:
        create = Create(args.spec.read_text())
        first, success, failure = sample(create)
    except BenchError as exc:
        sys.exit(f"bench.evaluator: {exc}")
    expressions = [e for e in (_cel(failure), _cel(success)) if e]
    if not expressions:
        sys.exit("bench.evaluator: the create's conditions are not CEL; nothing to measure")
    second = copy.deepcopy(first)
    second["metadata"]["resourceVersion"] = str(int(first["metadata"]["resourceVersion"]) + 1)
    print(
        f"Bounded CEL/jq evaluation over a {first['kind']} of {len(json.dumps(first))} bytes "
        f"(limits {evaluator.TIME_LIMIT_SECONDS:g} s, {evaluator.MEMORY_LIMIT_MIB} MiB), "
        f"best of {REPEATS} x {rounds}"
    )
    print(f"  {'µs per call':<44} {'in-process':>9} {'via child':>10} {'overhead/eval':>14}")
    alone = _cel_program(expressions[-1])
    inside = _per_call_us(
        lambda obj: alone.evaluate({"self": celpy.json_to_cel(obj)}), [first, second], rounds
    )
    child = _per_call_us(
        lambda obj: evaluator.evaluate_cel(expressions[-1], "self", obj), [first, second], rounds
    )
    overhead = _row("one CEL condition alone, changed object", inside, child, 1)
    programs = [_cel_program(e) for e in expressions]

    def move_in_process(obj: dict[str, Any]) -> None:
        for program in programs:
            program.evaluate({"self": celpy.json_to_cel(obj)})

    def move_via_child(obj: dict[str, Any]) -> None:
        for expression in expressions:
            evaluator.evaluate_cel(expression, "self", obj)

    n = len(expressions)
    for label, objects in (("changed object", [first, second]), ("same object", [first])):
        inside = _per_call_us(move_in_process, objects, rounds)
        child = _per_call_us(move_via_child, objects, rounds)
        _row(f"a move's {n} CEL condition(s), {label}", inside, child, n)
    jq_filter = _jq_filter(create)
    program = jq.compile(jq_filter)
    inside = _per_call_us(lambda obj: program.input_value(obj).all(), [first, second], rounds)
    child = _per_call_us(lambda obj: evaluator.evaluate_jq(jq_filter, obj), [first, second], rounds)
    _row(f"a jq output filter ({jq_filter})", inside, child, 1)
    figures_record({"evaluator_cel_overhead_us": round(overhead, 1)}, _figures_path())


def _figures_path() -> str:
    """`var/bench.json` (or under $OPSDECK_VAR_DIR): no outer process names it here."""
    return str(Path(os.environ.get("OPSDECK_VAR_DIR") or "var") / "bench.json")


if __name__ == "__main__":
    main()
