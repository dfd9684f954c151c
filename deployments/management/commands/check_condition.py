"""`manage.py check_condition --object FILE [--success EXPR] [--failure EXPR]`.

Decides a resource task's successCondition / failureCondition against an object read from a
JSON or YAML file (`kubectl get … -o json` or `-o yaml`; `-` reads standard input), by the
rules the workflow engine applies: it prints `succeeded`, `failed` or `pending`.
"""

import json
import sys
from pathlib import Path

import yaml
from django.core.management.base import BaseCommand, CommandError

from deployments.workflow import safe_yaml
from deployments.workflow.conditions import ConditionError, evaluate, parse_condition


def _parse(text: str, name: str) -> object:
    try:
        obj = json.loads(text)
    except RecursionError:  # the JSON decoder recurses once per level of nesting
        raise _too_deep(name) from None
    except json.JSONDecodeError as json_error:
        try:
            return safe_yaml.load(text)
        except safe_yaml.BoundsError as bounds_error:
            mark = bounds_error.problem_mark
            where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
            raise CommandError(f"{name} is refused{where}: {bounds_error.problem}") from None
        except yaml.YAMLError as yaml_error:
            if name.endswith(".json") or text.lstrip().startswith(("{", "[")):
                where = f"line {json_error.lineno}, column {json_error.colno}"
                message = f"{name} is not valid JSON ({json_error.msg} at {where})"
                raise CommandError(message) from None
            mark = getattr(yaml_error, "problem_mark", None)
            where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
            problem = getattr(yaml_error, "problem", None) or "syntax error"
            raise CommandError(f"{name} is not valid JSON or YAML ({problem}{where})") from None
    if safe_yaml.depth(obj) > safe_yaml.MAX_DEPTH:
        raise _too_deep(name)
    return obj


def _too_deep(name: str) -> CommandError:
    limit = safe_yaml.MAX_DEPTH
    return CommandError(f"{name} is refused: the document nests deeper than {limit} levels")


def read_object(path: str) -> dict:
    """The Kubernetes object in a JSON or YAML file; CommandError with one line otherwise."""
    name = "standard input" if path == "-" else path
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise CommandError(f"cannot read {name}: it is not UTF-8 text") from None
    except OSError as exc:
        raise CommandError(f"cannot read {name}: {exc.strerror or exc}") from None
    obj = _parse(text, name)
    if not isinstance(obj, dict):
        raise CommandError(f"{name} must hold one object (a mapping), not {type(obj).__name__}")
    return obj


def _parsed(option: str, text: str | None) -> None:
    """Parse one condition so that a bad one is reported with the option that holds it."""
    if not text:
        return
    try:
        parse_condition(text)
    except ConditionError as exc:
        # a CEL message continues with a caret drawing; the first line says what is wrong
        raise CommandError(f"{option}: {str(exc).splitlines()[0]}") from None


class Command(BaseCommand):
    help = (
        "Evaluate a successCondition / failureCondition against an object (JSON or YAML) and "
        "print succeeded, failed or pending, as a workflow's resource task would decide."
    )
    requires_system_checks = []

    def add_arguments(self, parser):
        parser.add_argument(
            "--object",
            required=True,
            metavar="FILE",
            help="the object as JSON or YAML (e.g. kubectl get -o yaml); - reads standard input",
        )
        parser.add_argument("--success", metavar="EXPR", help="successCondition")
        parser.add_argument("--failure", metavar="EXPR", help="failureCondition")

    def handle(self, *args, **options):
        success, failure = options["success"], options["failure"]
        _parsed("--success", success)
        _parsed("--failure", failure)
        obj = read_object(options["object"])
        try:
            decision = evaluate(obj, success, failure)
        except ConditionError as exc:  # a cel: condition that exceeded its time or memory bound
            raise CommandError(str(exc)) from None
        except RecursionError:  # a condition or object deeper than the evaluator's stack
            raise CommandError("cannot evaluate the conditions: they nest too deeply") from None
        self.stdout.write(decision)
