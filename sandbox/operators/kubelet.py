"""The kubelet's part of a pod failure: containers that crash, back off and start again.

The simulated controllers own their pods' status; these helpers give them the status a
kubelet would report while a container crash-loops (a fault the sandbox injects on a named
pod, see `Faults.fail_pod`) and once it runs again, and the Event it records.
"""

from __future__ import annotations

import copy
from typing import Any

from ..core import now_iso
from .machinery import EventRecorder

CRASH_LOOP = "CrashLoopBackOff"
COMPONENT = "kubelet"


def crashed(pod: dict[str, Any]) -> bool:
    """True while a container of the pod waits in CrashLoopBackOff."""
    return any(
        (s.get("state") or {}).get("waiting", {}).get("reason") == CRASH_LOOP
        for s in (pod.get("status") or {}).get("containerStatuses") or []
    )


def crash_status(pod: dict[str, Any]) -> dict[str, Any]:
    """The pod's status once its containers died: not ready, restarted once more, backing off."""
    meta = pod["metadata"]
    now = now_iso()
    status = copy.deepcopy(pod.get("status") or {})
    names = []
    for container in status.get("containerStatuses") or []:
        names.append(container.get("name", ""))
        started = ((container.get("state") or {}).get("running") or {}).get("startedAt", now)
        container.update(
            {
                "ready": False,
                "started": False,
                "restartCount": int(container.get("restartCount", 0)) + 1,
                "lastState": {
                    "terminated": {
                        "exitCode": 137,
                        "reason": "Error",
                        "startedAt": started,
                        "finishedAt": now,
                    }
                },
                "state": {
                    "waiting": {
                        "reason": CRASH_LOOP,
                        "message": f"back-off 10s restarting failed "
                        f"container={container.get('name', '')} "
                        f"pod={meta['name']}_{meta.get('namespace', '')}({meta.get('uid', '')})",
                    }
                },
            }
        )
    for condition in status.get("conditions") or []:
        if condition.get("type") in ("Ready", "ContainersReady"):
            condition.update(
                {
                    "status": "False",
                    "reason": "ContainersNotReady",
                    "message": f"containers with unready status: [{' '.join(names)}]",
                    "lastTransitionTime": now,
                }
            )
    return status


def restarted_status(pod: dict[str, Any]) -> dict[str, Any]:
    """The pod's status once its containers run again (restart counts and last state kept)."""
    now = now_iso()
    status = copy.deepcopy(pod.get("status") or {})
    for container in status.get("containerStatuses") or []:
        container.update({"ready": True, "started": True, "state": {"running": {"startedAt": now}}})
    for condition in status.get("conditions") or []:
        if condition.get("type") in ("Ready", "ContainersReady"):
            condition.pop("reason", None)
            condition.pop("message", None)
            condition.update({"status": "True", "lastTransitionTime": now})
    return status


def record_backoff(events: EventRecorder, pod: dict[str, Any]) -> None:
    """The kubelet's Warning about a crashing container."""
    meta = pod["metadata"]
    body = {**pod, "apiVersion": "v1", "kind": "Pod"}
    for container in pod["spec"].get("containers") or []:
        events.record(
            body,
            "BackOff",
            f"Back-off restarting failed container {container.get('name', '')} in pod "
            f"{meta['name']}_{meta.get('namespace', '')}({meta.get('uid', '')})",
            "Warning",
        )
