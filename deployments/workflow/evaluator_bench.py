"""`python -m deployments.workflow.evaluator_bench`: what bounding CEL and jq costs per evaluation.

Conditions are evaluated on every move of a waiting resource task, so the evaluator child
(`evaluator.py`) must add little to each. This prints, for a CloudNativePG Cluster as the
sandbox's simulation reports it and the CloudNativePG plan's modify conditions: µs for one
condition alone and for one move's failure and success conditions, in this process (celpy
directly, as before the child existed) and through the child, and the overhead per
evaluation; the same for a jq output.
"changed object" alternates two objects, as watch events bring (the child converts the object
once per move); "same object" is a safety-net poll of an unchanged one. Figures are printed,
never asserted. Never imported by the request path.
"""

from __future__ import annotations

import copy
import hashlib
import json
import time
from collections.abc import Callable
from typing import Any

import celpy
import jq

from deployments.workflow import evaluator

ROUNDS = 400
REPEATS = 5
SUCCESS = (
    'self.status.phase == "Cluster in healthy state" && self.status.readyInstances == 3 '
    "&& self.status.instances == 3"
)
FAILURE = (
    'self.status.phase in ["Cluster is unrecoverable and needs manual intervention", '
    '"Invalid cluster definition", "Unable to create required cluster objects"]'
)
JQ_FILTER = '.status.conditions[] | select(.type == "Ready") | .status'


def cnpg_cluster(name: str = "inst-a1b2c3d4", resource_version: int = 41207) -> dict[str, Any]:
    """A healthy three-instance Cluster with the fields CloudNativePG and the API server set."""
    instances = [f"{name}-{n}" for n in (1, 2, 3)]
    stamp = "2025-03-14T09:26:53Z"

    def condition(kind: str, status: str, reason: str, message: str) -> dict[str, str]:
        return {
            "type": kind,
            "status": status,
            "reason": reason,
            "message": message,
            "lastTransitionTime": stamp,
        }

    return {
        "apiVersion": "postgresql.cnpg.io/v1",
        "kind": "Cluster",
        "metadata": {
            "name": name,
            "namespace": name,
            "uid": "5f0c8a4e-6d1b-4f7e-9c2a-3b8d7e6f1a20",
            "resourceVersion": str(resource_version),
            "generation": 4,
            "creationTimestamp": stamp,
            "labels": {"opsdeck.io/instance": name, "opsdeck.io/operation": "op-7Hq2kP9x"},
            "annotations": {
                "cnpg.io/hibernation": "off",
                "kubectl.kubernetes.io/restartedAt": stamp,
            },
            "managedFields": [
                {
                    "manager": "opsdeck",
                    "operation": "Apply",
                    "apiVersion": "postgresql.cnpg.io/v1",
                    "time": stamp,
                    "fieldsType": "FieldsV1",
                    "fieldsV1": {
                        "f:metadata": {"f:labels": {"f:opsdeck.io/instance": {}}},
                        "f:spec": {
                            f"f:{key}": {}
                            for key in ("instances", "imageName", "storage", "resources")
                        },
                    },
                },
                {
                    "manager": "cloudnative-pg",
                    "operation": "Update",
                    "apiVersion": "postgresql.cnpg.io/v1",
                    "time": stamp,
                    "fieldsType": "FieldsV1",
                    "subresource": "status",
                    "fieldsV1": {"f:status": {"f:phase": {}, "f:conditions": {}}},
                },
            ],
        },
        "spec": {
            "instances": 3,
            "imageName": "ghcr.io/cloudnative-pg/postgresql:16.4",
            "primaryUpdateStrategy": "unsupervised",
            "storage": {"size": "20Gi", "resizeInUseVolumes": True},
            "resources": {
                "requests": {"cpu": "2", "memory": "4Gi"},
                "limits": {"cpu": "2", "memory": "4Gi"},
            },
            "postgresql": {
                "parameters": {
                    "max_connections": "200",
                    "shared_buffers": "1GB",
                    "log_min_duration_statement": "1000",
                    "pg_stat_statements.max": "10000",
                },
            },
            "bootstrap": {
                "initdb": {"database": "app", "owner": "app", "secret": {"name": f"{name}-owner"}}
            },
            "backup": {
                "retentionPolicy": "30d",
                "barmanObjectStore": {
                    "destinationPath": "s3://sandbox/opsdeck",
                    "serverName": name,
                    "s3Credentials": {
                        "accessKeyId": {"name": "backup-credentials", "key": "ACCESS_KEY_ID"},
                        "secretAccessKey": {
                            "name": "backup-credentials",
                            "key": "ACCESS_SECRET_KEY",
                        },
                    },
                },
            },
        },
        "status": {
            "phase": "Cluster in healthy state",
            "instances": 3,
            "readyInstances": 3,
            "currentPrimary": instances[0],
            "targetPrimary": instances[0],
            "currentPrimaryTimestamp": stamp,
            "latestGeneratedNode": 3,
            "timelineID": 1,
            "image": "ghcr.io/cloudnative-pg/postgresql:16.4",
            "writeService": f"{name}-rw",
            "readService": f"{name}-r",
            "selector": f"cnpg.io/cluster={name},cnpg.io/podRole=instance",
            "pvcCount": 3,
            "healthyPVC": instances,
            "instanceNames": instances,
            "instancesStatus": {"healthy": instances},
            "instancesReportedState": {
                inst: {"isPrimary": inst == instances[0], "timeLineID": 1} for inst in instances
            },
            "secretsResourceVersion": {
                "superuserSecretVersion": "41003",
                "applicationSecretVersion": "41004",
                "clientCaSecretVersion": "41001",
                "serverCaSecretVersion": "41001",
                "serverSecretVersion": "41002",
                "replicationSecretVersion": "41002",
            },
            "certificates": {
                "clientCASecret": f"{name}-ca",
                "serverCASecret": f"{name}-ca",
                "serverTLSSecret": f"{name}-server",
                "replicationTLSSecret": f"{name}-replication",
                "serverAltDNSNames": [
                    f"{name}-{kind}{suffix}"
                    for kind in ("rw", "r", "ro")
                    for suffix in ("", f".{name}", f".{name}.svc", f".{name}.svc.cluster.local")
                ],
                "expirations": {
                    f"{name}-{what}": "2025-06-12 09:21:53 +0000 UTC"
                    for what in ("ca", "server", "replication")
                },
            },
            "conditions": [
                condition("Ready", "True", "ClusterIsReady", "Cluster is Ready"),
                condition(
                    "ContinuousArchiving",
                    "True",
                    "ContinuousArchivingSuccess",
                    "Continuous archiving is working",
                ),
                condition("LastBackupSucceeded", "True", "LastBackupSucceeded", "Backup was ok"),
                condition("cnpg.io/hibernation", "False", "Rehydrated", "Cluster was rehydrated"),
            ],
            "firstRecoverabilityPoint": stamp,
            "lastSuccessfulBackup": stamp,
            "managedRolesStatus": {},
            "availableArchitectures": [
                {"goArch": arch, "hash": hashlib.sha256(arch.encode()).hexdigest()}
                for arch in ("amd64", "arm64")
            ],
            "cloudNativePGCommitHash": "a1c4f0e7",
            "cloudNativePGOperatorHash": hashlib.sha256(b"operator").hexdigest(),
            "onlineUpdateEnabled": True,
            "pgDataImageInfo": {
                "image": "ghcr.io/cloudnative-pg/postgresql:16.4",
                "majorVersion": 16,
            },
            "switchReplicaClusterStatus": {},
            "poolerIntegrations": {"pgBouncerIntegration": {}},
            "topology": {
                "instances": {inst: {} for inst in instances},
                "successfullyExtracted": True,
            },
        },
    }


def _per_call_us(call: Callable[[dict[str, Any]], Any], objects: list[dict[str, Any]]) -> float:
    """µs per call, the best of REPEATS batches: the machine's other load only adds time."""
    for obj in objects * 50:  # warm up: the child started, programs compiled and cached
        call(obj)
    best = float("inf")
    for _ in range(REPEATS):
        start = time.perf_counter()
        for i in range(ROUNDS):
            call(objects[i % len(objects)])
        best = min(best, time.perf_counter() - start)
    return best / ROUNDS * 1e6


def _cel_program(expression: str) -> celpy.Runner:
    environment = celpy.Environment()
    return environment.program(environment.compile(expression))


def _move_in_process() -> Callable[[dict[str, Any]], Any]:
    """The conditions of one move as they ran before the child: celpy in this process."""
    failure, success = _cel_program(FAILURE), _cel_program(SUCCESS)

    def move(obj: dict[str, Any]) -> Any:
        failure.evaluate({"self": celpy.json_to_cel(obj)})
        return success.evaluate({"self": celpy.json_to_cel(obj)})

    return move


def _move_via_child(obj: dict[str, Any]) -> Any:
    evaluator.evaluate_cel(FAILURE, "self", obj)
    return evaluator.evaluate_cel(SUCCESS, "self", obj)


def _row(label: str, inside: float, child: float, evaluations: int) -> None:
    overhead = (child - inside) / evaluations
    print(f"  {label:<44} {inside:9.0f} {child:10.0f} {overhead:+14.0f}")


def main() -> None:
    """Print µs in-process and through the evaluator child, and the overhead per evaluation."""
    first = cnpg_cluster()
    second = copy.deepcopy(first)
    second["metadata"]["resourceVersion"] = "41208"
    print(
        f"Bounded CEL/jq evaluation over a CNPG Cluster of {len(json.dumps(first))} bytes "
        f"(limits {evaluator.TIME_LIMIT_SECONDS:g} s, {evaluator.MEMORY_LIMIT_MIB} MiB), "
        f"best of {REPEATS} x {ROUNDS}"
    )
    print(f"  {'µs per call':<44} {'in-process':>9} {'via child':>10} {'overhead/eval':>14}")
    success = _cel_program(SUCCESS)
    inside = _per_call_us(
        lambda obj: success.evaluate({"self": celpy.json_to_cel(obj)}), [first, second]
    )
    child = _per_call_us(lambda obj: evaluator.evaluate_cel(SUCCESS, "self", obj), [first, second])
    _row("one CEL condition alone, changed object", inside, child, 1)
    move = _move_in_process()
    for label, objects in (("changed object", [first, second]), ("same object", [first])):
        inside = _per_call_us(move, objects)
        child = _per_call_us(_move_via_child, objects)
        _row(f"a move's 2 CEL conditions, {label}", inside, child, 2)
    program = jq.compile(JQ_FILTER)
    inside = _per_call_us(lambda obj: program.input_value(obj).all(), [first, second])
    child = _per_call_us(lambda obj: evaluator.evaluate_jq(JQ_FILTER, obj), [first, second])
    _row("a jq output filter", inside, child, 1)


if __name__ == "__main__":
    main()
