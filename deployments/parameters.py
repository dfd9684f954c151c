"""An instance's parameter values as operations change them: what a run applies, and what the
instance holds once it succeeded.

An operation stores only the changes its request asked for. When it starts, its whole
parameter set is worked out from the instance's values at that moment, so an operation queued
behind another builds on what the one before it left (no lost update); when it succeeds, the
instance takes the values the run applied, in the transaction that marks it succeeded.
"""

from __future__ import annotations

import json
from typing import Any

from deployments.lifecycle import APPLIES_PARAMETERS
from deployments.models import Instance, Operation
from deployments.spec.model import Parameter, Verb
from deployments.spec.params import initial_value


def split_values(parameters: list[Parameter], values: dict) -> tuple[dict, str]:
    """Plain values, and the JSON of the Password ones (stored encrypted; "" when none)."""
    secret = {p.key for p in parameters if p.type == "Password"}
    plain = {k: v for k, v in values.items() if k not in secret}
    hidden = {k: v for k, v in values.items() if k in secret}
    return plain, json.dumps(hidden) if hidden else ""


def values_for_version(parameters: list[Parameter], values: dict) -> dict:
    """`values` as a plan version with `parameters` takes them (an upgrade): those it no longer
    has are dropped, those it adds take their defaults (a new Password is generated)."""
    kept = {p.key: values[p.key] for p in parameters if p.key in values}
    for parameter in parameters:
        if parameter.key not in kept:
            found, value = initial_value(parameter)
            if found:
                kept[parameter.key] = value
    return kept


def instance_values(instance: Instance) -> dict:
    """All of an instance's parameter values, Password ones included."""
    hidden = json.loads(instance.secret_parameters) if instance.secret_parameters else {}
    return {**instance.parameters, **hidden}


def _requested_secret(op: Operation) -> dict:
    return json.loads(op.requested_secret) if op.requested_secret else {}


def requested_changes(op: Operation) -> dict:
    """The instance parameter values the operation's request sets, Password ones included."""
    return {**op.requested, **_requested_secret(op).get("parameters", {})}


def verb_values(op: Operation) -> dict:
    """The values of a custom verb's own parameters, Password ones included."""
    return {
        **op.arguments.get("verb_parameters", {}),
        **_requested_secret(op).get("verb_parameters", {}),
    }


def run_values(op: Operation) -> dict:
    """The parameter set the operation's run applies (recorded on it when it started)."""
    hidden = json.loads(op.secret_parameters) if op.secret_parameters else {}
    return {**op.parameters, **hidden}


def values_after(
    op: Operation, verb: Verb, before: dict[str, Any], *, passwords: bool = True
) -> dict | None:
    """The instance's values once `op` has succeeded, starting from `before` (what it applied,
    or what the instance is projected to hold); None when the verb changes no parameter.
    Without `passwords`, the Password values it sets are left out (nothing is decrypted)."""
    if op.verb in APPLIES_PARAMETERS:
        return {**before, **(requested_changes(op) if passwords else op.requested)}
    if verb.updates:
        given = verb_values(op) if passwords else op.arguments.get("verb_parameters", {})
        updates = {
            target: given[source] for target, source in verb.updates.items() if source in given
        }
        return {**before, **updates}
    return None
