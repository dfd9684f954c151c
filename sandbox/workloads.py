"""Defaulting and validation of StatefulSets and PersistentVolumeClaim updates.

What kube-apiserver's registry does for `apps/v1` StatefulSets (SetDefaults_StatefulSet,
ValidateStatefulSet, ValidateStatefulSetUpdate) and for claim updates (volume expansion), for
the fields a plan spec touches. Messages are the real server's.
"""

from __future__ import annotations

import copy
import re
from decimal import Decimal, InvalidOperation
from typing import Any

from .errors import FieldError, RawValue, invalid, required
from .selectors import label_selector_matcher

# Fields of a StatefulSet's spec an update may change; the rest is fixed at creation.
STS_MUTABLE = (
    "replicas",
    "ordinals",
    "template",
    "updateStrategy",
    "persistentVolumeClaimRetentionPolicy",
    "minReadySeconds",
    "revisionHistoryLimit",
)
STS_FORBIDDEN = (
    "updates to statefulset spec for fields other than 'replicas', 'ordinals', 'template', "
    "'updateStrategy', 'persistentVolumeClaimRetentionPolicy' and 'minReadySeconds' are forbidden"
)
PVC_IMMUTABLE = (
    "spec is immutable after creation except resources.requests and volumeAttributesClassName "
    "for bound claims"
)
_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_QUANTITY = re.compile(
    r"^([+-]?(?:\d+\.?\d*|\.\d+))(?:([eE][+-]?\d+)|(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]))?$"
)
_SUFFIX = {
    "": Decimal(1),
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
    **{s: Decimal(1024) ** (i + 1) for i, s in enumerate(("Ki", "Mi", "Gi", "Ti", "Pi", "Ei"))},
}


def parse_quantity(value: Any) -> Decimal | None:
    """A Kubernetes resource quantity ("1Gi", "500M", "1.5e3") as a number, else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return Decimal(str(value))
    match = _QUANTITY.match(str(value or "").strip())
    if not match:
        return None
    number, exponent, suffix = match.groups()
    try:
        amount = Decimal(number)
        return amount * (Decimal(10) ** int(exponent[1:]) if exponent else _SUFFIX[suffix or ""])
    except (InvalidOperation, ValueError):
        return None


def go_map(labels: Any) -> RawValue:
    """A map[string]string printed as Go's %#v does in a field error."""
    if not isinstance(labels, dict) or not labels:
        return RawValue("map[string]string(nil)" if not labels else "map[string]string{}")
    inner = ", ".join(f'"{k}":"{labels[k]}"' for k in sorted(labels))
    return RawValue(f"map[string]string{{{inner}}}")


# ---- StatefulSet ------------------------------------------------------------------------------


def default_statefulset(obj: dict[str, Any]) -> None:
    """SetDefaults_StatefulSet and the pod template defaults, in place."""
    spec = obj.setdefault("spec", {})
    if not isinstance(spec, dict):
        return
    spec.setdefault("replicas", 1)
    spec.setdefault("podManagementPolicy", "OrderedReady")
    spec.setdefault("revisionHistoryLimit", 10)
    strategy = spec.setdefault("updateStrategy", {})
    if isinstance(strategy, dict):
        strategy.setdefault("type", "RollingUpdate")
        if strategy["type"] == "RollingUpdate":
            rolling = strategy.setdefault("rollingUpdate", {})
            if isinstance(rolling, dict):
                rolling.setdefault("partition", 0)
    retention = spec.setdefault("persistentVolumeClaimRetentionPolicy", {})
    if isinstance(retention, dict):
        retention.setdefault("whenDeleted", "Retain")
        retention.setdefault("whenScaled", "Retain")
    template = spec.get("template")
    if isinstance(template, dict) and isinstance(template.get("spec"), dict):
        default_pod_spec(template["spec"])
    for claim in spec.get("volumeClaimTemplates") or []:
        if not isinstance(claim, dict):
            continue
        claim.setdefault("apiVersion", "v1")
        claim.setdefault("kind", "PersistentVolumeClaim")
        claim_spec = claim.setdefault("spec", {})
        if isinstance(claim_spec, dict):
            claim_spec.setdefault("volumeMode", "Filesystem")
        claim.setdefault("status", {"phase": "Pending"})


def default_pod_spec(spec: dict[str, Any]) -> None:
    """The defaults kube-apiserver gives every pod spec (SetDefaults_PodSpec and containers)."""
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("securityContext", {})
    for container in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
        if not isinstance(container, dict):
            continue
        image = str(container.get("image") or "")
        tag = image.rsplit("/", 1)[-1]
        latest = "@" not in tag and (":" not in tag or tag.endswith(":latest"))
        container.setdefault("imagePullPolicy", "Always" if latest else "IfNotPresent")
        container.setdefault("terminationMessagePath", "/dev/termination-log")
        container.setdefault("terminationMessagePolicy", "File")
        for port in container.get("ports") or []:
            if isinstance(port, dict):
                port.setdefault("protocol", "TCP")


def prepare_statefulset(obj: dict[str, Any], old: dict[str, Any] | None) -> list[FieldError]:
    """Default a StatefulSet and validate it (and, on update, what an update may change)."""
    default_statefulset(obj)
    if old is None:
        # The status of a new StatefulSet is the controller's, and starts empty.
        obj["status"] = {"replicas": 0, "availableReplicas": 0}
    errs = validate_statefulset_spec(obj.get("spec") or {})
    if old is not None and not errs:
        new_spec = {k: v for k, v in (obj.get("spec") or {}).items() if k not in STS_MUTABLE}
        old_spec = {k: v for k, v in (old.get("spec") or {}).items() if k not in STS_MUTABLE}
        if new_spec != old_spec:
            errs.append(FieldError("FieldValueForbidden", "spec", STS_FORBIDDEN))
    return errs


def validate_statefulset_spec(spec: dict[str, Any]) -> list[FieldError]:
    """ValidateStatefulSetSpec for the fields the sandbox and its controller read."""
    errs: list[FieldError] = []
    policy = spec.get("podManagementPolicy")
    if policy not in ("OrderedReady", "Parallel"):
        errs.append(
            invalid("spec.podManagementPolicy", policy, "must be 'OrderedReady' or 'Parallel'")
        )
    strategy = spec.get("updateStrategy") or {}
    stype = strategy.get("type") if isinstance(strategy, dict) else None
    if stype == "OnDelete" and strategy.get("rollingUpdate") is not None:
        errs.append(
            invalid(
                "spec.updateStrategy.rollingUpdate",
                RawValue("apps.RollingUpdateStatefulSetStrategy{...}"),
                "only allowed for updateStrategy 'RollingUpdate'",
            )
        )
    elif stype == "RollingUpdate":
        partition = (strategy.get("rollingUpdate") or {}).get("partition", 0)
        errs += _non_negative("spec.updateStrategy.rollingUpdate.partition", partition)
    else:
        errs.append(
            invalid(
                "spec.updateStrategy",
                RawValue(f'apps.StatefulSetUpdateStrategy{{Type:"{stype}"}}'),
                "must be 'RollingUpdate' or 'OnDelete'",
            )
        )
    for field in ("replicas", "minReadySeconds", "revisionHistoryLimit"):
        if field in spec:
            errs += _non_negative(f"spec.{field}", spec[field])
    start = (spec.get("ordinals") or {}).get("start", 0)
    errs += _non_negative("spec.ordinals.start", start)
    service = spec.get("serviceName")
    if service and not (
        isinstance(service, str) and len(service) <= 63 and _DNS1123_LABEL.match(service)
    ):
        errs.append(invalid("spec.serviceName", service, "must be a valid DNS label"))
    selector = spec.get("selector")
    if not isinstance(selector, dict):
        errs.append(required("spec.selector"))
    elif not selector.get("matchLabels") and not selector.get("matchExpressions"):
        errs.append(
            invalid(
                "spec.selector",
                RawValue(
                    "v1.LabelSelector{MatchLabels:map[string]string(nil), "
                    "MatchExpressions:[]v1.LabelSelectorRequirement(nil)}"
                ),
                "empty selector is invalid for statefulset",
            )
        )
    template = spec.get("template")
    if not isinstance(template, dict):
        errs.append(required("spec.template"))
        return errs
    labels = (template.get("metadata") or {}).get("labels") or {}
    selects = isinstance(selector, dict) and (
        selector.get("matchLabels") or selector.get("matchExpressions")
    )
    if selects and not label_selector_matcher(selector)(labels):
        errs.append(
            invalid(
                "spec.template.metadata.labels",
                go_map(labels),
                "`selector` does not match template `labels`",
            )
        )
    pod_spec = template.get("spec") or {}
    if not pod_spec.get("containers"):
        errs.append(required("spec.template.spec.containers"))
    if pod_spec.get("restartPolicy", "Always") != "Always":
        errs.append(
            FieldError(
                "FieldValueNotSupported",
                "spec.template.spec.restartPolicy",
                value=pod_spec["restartPolicy"],
                supported=["Always"],
            )
        )
    for i, claim in enumerate(spec.get("volumeClaimTemplates") or []):
        errs += _claim_template_errors(f"spec.volumeClaimTemplates[{i}]", claim)
    return errs


def _claim_template_errors(path: str, claim: Any) -> list[FieldError]:
    if not isinstance(claim, dict):
        return [required(path)]
    errs = []
    if not (claim.get("metadata") or {}).get("name"):
        errs.append(required(f"{path}.metadata.name", "name or generateName is required"))
    spec = claim.get("spec") or {}
    if not spec.get("accessModes"):
        errs.append(required(f"{path}.spec.accessModes", "at least 1 access mode is required"))
    storage = ((spec.get("resources") or {}).get("requests") or {}).get("storage")
    if storage is None:
        errs.append(required(f"{path}.spec.resources[storage]"))
    elif parse_quantity(storage) is None:
        errs.append(
            invalid(
                f"{path}.spec.resources.requests[storage]",
                storage,
                "quantities must match the regular expression "
                "'^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'",
            )
        )
    return errs


def _non_negative(path: str, value: Any) -> list[FieldError]:
    if isinstance(value, int) and not isinstance(value, bool) and value < 0:
        return [invalid(path, value, "must be greater than or equal to 0")]
    return []


# ---- PersistentVolumeClaim --------------------------------------------------------------------


def storage_request(pvc: dict[str, Any]) -> Any:
    """spec.resources.requests.storage of a claim (as written)."""
    return (((pvc.get("spec") or {}).get("resources") or {}).get("requests") or {}).get("storage")


def storage_capacity(pvc: dict[str, Any]) -> Any:
    """status.capacity.storage of a claim (as written)."""
    return ((pvc.get("status") or {}).get("capacity") or {}).get("storage")


def validate_pvc_update(new: dict[str, Any], old: dict[str, Any]) -> list[FieldError]:
    """ValidatePersistentVolumeClaimUpdate: only a bound claim's storage request may change.

    Since Kubernetes 1.34 (RecoverVolumeExpansionFailure, GA) a request may go back down, to
    recover from a failed expansion, but never to status.capacity or below.
    """
    errs: list[FieldError] = []
    new_spec = copy.deepcopy(new.get("spec") or {})
    old_spec = old.get("spec") or {}
    bound = (old.get("status") or {}).get("phase") == "Bound"
    new_size, old_size = parse_quantity(storage_request(new)), parse_quantity(storage_request(old))
    capacity = parse_quantity(storage_capacity(old))
    shrunk = new_size is not None and old_size is not None and new_size < old_size
    if bound and shrunk and (capacity is None or new_size <= capacity):
        errs.append(
            FieldError(
                "FieldValueForbidden",
                "spec.resources.requests.storage",
                "field can not be less than status.capacity",
            )
        )
    if bound and "storage" in ((old_spec.get("resources") or {}).get("requests") or {}):
        requests = new_spec.setdefault("resources", {}).setdefault("requests", {})
        if isinstance(requests, dict):
            requests["storage"] = old_spec["resources"]["requests"]["storage"]
    if not old_spec.get("volumeName"):
        # The binder sets volumeName once.
        new_spec.pop("volumeName", None)
        old_spec = {k: v for k, v in old_spec.items() if k != "volumeName"}
    new_spec.pop("volumeAttributesClassName", None)
    if new_spec != {k: v for k, v in old_spec.items() if k != "volumeAttributesClassName"}:
        errs.append(FieldError("FieldValueForbidden", "spec", PVC_IMMUTABLE))
    return errs
