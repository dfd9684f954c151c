"""ResourceQuota: what kube-apiserver's quota admission and kube-controller-manager's quota
controller do.

A quota's `status.hard` (its `spec.hard`) and `status.used` (what the namespace's objects use of
each resource it names) are filled as soon as the quota is written, and kept current as objects
come and go (the controller's job; the quota's watchers see MODIFIED events). A create, or an
update that grows usage (a claim's storage request, a Service's type), that would take `used`
above `hard` is refused with the real 403 (`exceeded quota: q, requested: ..., used: ...,
limited: ...`); a pod that states no cpu or memory request where a quota limits them is refused
(`failed quota: q: must specify requests.cpu`). Objects the simulated controllers create go
through the same admission. Quantities are summed and printed as apimachinery's
resource.Quantity does (`10Gi` + `10Gi` is `20Gi`, `500m` + `1` is `1500m`).

Not emulated: scopes and scopeSelector (a quota with them counts every object), pod-level
resources, sidecar init containers counted apart from the others, and the DefaultStorageClass
admission (a claim without `storageClassName` is charged to no storage class).
"""

from __future__ import annotations

import datetime as dt
import math
import re
from dataclasses import dataclass
from decimal import ROUND_CEILING, Decimal
from typing import TYPE_CHECKING, Any

from . import errors as E
from .store import Key
from .workloads import parse_quantity, storage_request

if TYPE_CHECKING:
    from .core import Core, Ctx
    from .resources import ResourceType

QUOTAS: Key = ("", "resourcequotas")
PODS: Key = ("", "pods")
SERVICES: Key = ("", "services")
CLAIMS: Key = ("", "persistentvolumeclaims")
# Core kinds whose object count a quota also names without `count/` (e.g. `secrets`).
LEGACY_COUNTS = {"configmaps", "resourcequotas", "replicationcontrollers", "secrets"}
# Pod resources named bare as well as `requests.` (`cpu` is `requests.cpu`).
BARE_REQUESTS = {"cpu", "memory", "ephemeral-storage"}
# A quota naming one of these makes every container state it (a mistake Kubernetes keeps).
MUST_SPECIFY = {"cpu", "memory", "requests.cpu", "requests.memory", "limits.cpu", "limits.memory"}
STORAGE_CLASS = ".storageclass.storage.k8s.io/"
# Kubernetes resource names whose quota must be a whole number (IsIntegerResourceName).
INTEGER_NAMES = {
    "pods",
    "services",
    "secrets",
    "configmaps",
    "persistentvolumeclaims",
    "resourcequotas",
    "replicationcontrollers",
    "services.nodeports",
    "services.loadbalancers",
}
QUANTITY_FORMAT = (
    "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
)
CONTROLLER = "kube-controller-manager"
_BINARY_SUFFIXES = ("", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei")
_DECIMAL_SUFFIXES = {
    -9: "n", -6: "u", -3: "m", 0: "", 3: "k", 6: "M", 9: "G", 12: "T", 15: "P", 18: "E"
}  # fmt: skip
_EXPONENT = re.compile(r"[eE][+-]?\d+$")
_NANO = Decimal("1e-9")


@dataclass(frozen=True)
class Quantity:
    """A resource quantity as apimachinery's resource.Quantity: its value, and the format its
    text keeps (`BinarySI` for `Gi`, `DecimalSI` for `k`/`m`, `DecimalExponent` for `e3`); a
    sum keeps its first non-zero term's format."""

    value: Decimal
    format: str = "DecimalSI"

    @classmethod
    def parse(cls, text: Any) -> Quantity | None:
        """A quantity from its text (or a YAML number), rounded up to nano units as the server
        does; None if it is not one."""
        value = parse_quantity(text)
        if value is None:
            return None
        value = (value / _NANO).to_integral_value(ROUND_CEILING) * _NANO
        written = str(text).strip()
        if written.endswith("i"):
            return cls(value, "BinarySI")
        if _EXPONENT.search(written):
            return cls(value, "DecimalExponent")
        return cls(value)

    def __add__(self, other: Quantity) -> Quantity:
        return Quantity(self.value + other.value, other.format if not self.value else self.format)

    def __sub__(self, other: Quantity) -> Quantity:
        return Quantity(self.value - other.value, other.format if not self.value else self.format)

    def __str__(self) -> str:
        """The canonical text the API server answers (`1536Mi`, `1500m`, `2k`, `0`)."""
        if not self.value:
            return "0"
        whole = self.value == self.value.to_integral_value()
        if self.format == "BinarySI" and abs(self.value) >= 1024 and whole:
            amount, power = int(self.value), 0
            while power < len(_BINARY_SUFFIXES) - 1 and amount % 1024 == 0:
                amount //= 1024
                power += 1
            return f"{amount}{_BINARY_SUFFIXES[power]}"
        sign, digits, exponent = self.value.normalize().as_tuple()
        mantissa, exponent = int("".join(map(str, digits))), int(exponent)
        shift = exponent % 3  # the exponent goes down to a multiple of 3
        mantissa, exponent = mantissa * 10**shift, exponent - shift
        number = f"{'-' if sign else ''}{mantissa}"
        if self.format == "DecimalExponent" or exponent not in _DECIMAL_SUFFIXES:
            return f"{number}e{exponent}" if exponent else number
        return number + _DECIMAL_SUFFIXES[exponent]


ONE = Quantity(Decimal(1))
ZERO = Quantity(Decimal(0))


def count_name(key: Key) -> str:
    """The object-count resource of a kind: `count/secrets`, `count/statefulsets.apps`."""
    group, plural = key
    return f"count/{plural}.{group}" if group else f"count/{plural}"


def source_of(name: str) -> Key | None:
    """The kind whose objects use a quota resource (None for one no evaluator knows)."""
    if name.startswith("count/"):
        plural, _, group = name.removeprefix("count/").partition(".")
        return (group, plural)
    if name in LEGACY_COUNTS or name in ("pods", "services", "persistentvolumeclaims"):
        return ("", name)
    if name in ("services.nodeports", "services.loadbalancers"):
        return SERVICES
    if name == "requests.storage" or STORAGE_CLASS in name:
        return CLAIMS
    if name in BARE_REQUESTS or name.startswith(("requests.", "limits.", "hugepages-")):
        return PODS
    return None


def usage(key: Key, obj: dict[str, Any]) -> dict[str, Quantity]:
    """What one object uses of every quota resource it counts against."""
    if key == PODS:
        return _pod_usage(obj)
    found = {count_name(key): ONE}
    if key == SERVICES:
        found |= _service_usage(obj)
    elif key == CLAIMS:
        found |= _claim_usage(obj)
    elif key[0] == "" and key[1] in LEGACY_COUNTS:
        found[key[1]] = ONE
    return found


def _pod_usage(pod: dict[str, Any]) -> dict[str, Quantity]:
    """`count/pods` for every pod; the rest only while it runs (or may): a Succeeded or Failed
    pod, or one whose deletion grace period is over, no longer uses its compute resources."""
    found = {"count/pods": ONE}
    if not _pod_charged(pod):
        return found
    found["pods"] = ONE
    spec = pod.get("spec") or {}
    total: dict[str, Quantity] = {}
    for container in spec.get("containers") or []:
        for name, amount in _container_usage(container).items():
            total[name] = total.get(name, ZERO) + amount
    # Init containers run one at a time, before the others: the pod needs the largest.
    for container in spec.get("initContainers") or []:
        for name, amount in _container_usage(container).items():
            if name not in total or amount.value > total[name].value:
                total[name] = amount
    return found | total


def _pod_charged(pod: dict[str, Any]) -> bool:
    if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
        return False
    meta = pod["metadata"]
    grace = meta.get("deletionGracePeriodSeconds")
    if meta.get("deletionTimestamp") and grace is not None:
        deleted = dt.datetime.fromisoformat(meta["deletionTimestamp"].replace("Z", "+00:00"))
        return dt.datetime.now(dt.UTC) <= deleted + dt.timedelta(seconds=grace)
    return True


def _container_usage(container: dict[str, Any]) -> dict[str, Quantity]:
    resources = container.get("resources") or {}
    limits = resources.get("limits") or {}
    # The API server defaults a missing request to its limit before admission sees the pod.
    requests = {**limits, **(resources.get("requests") or {})}
    found: dict[str, Quantity] = {}
    for name, text in requests.items():
        if (amount := Quantity.parse(text)) is not None:
            found[f"requests.{name}"] = amount
            if name in BARE_REQUESTS or name.startswith("hugepages-"):
                found[name] = amount
    for name, text in limits.items():
        if (amount := Quantity.parse(text)) is not None:
            found[f"limits.{name}"] = amount
    return found


def _service_usage(service: dict[str, Any]) -> dict[str, Quantity]:
    spec = service.get("spec") or {}
    ports = spec.get("ports") or []
    found = {"services": ONE}
    if spec.get("type") == "NodePort":
        found["services.nodeports"] = Quantity(Decimal(len(ports)))
    elif spec.get("type") == "LoadBalancer":
        found["services.loadbalancers"] = ONE
        if spec.get("allocateLoadBalancerNodePorts") is False:
            ports = [p for p in ports if isinstance(p, dict) and p.get("nodePort")]
        found["services.nodeports"] = Quantity(Decimal(len(ports)))
    return found


def _claim_usage(claim: dict[str, Any]) -> dict[str, Quantity]:
    """A claim uses its storage request, or what was allocated to it if that is larger (an
    expansion under way, or one that failed and was asked back down)."""
    found = {"persistentvolumeclaims": ONE}
    annotations = claim["metadata"].get("annotations") or {}
    storage_class = (claim.get("spec") or {}).get("storageClassName") or annotations.get(
        "volume.beta.kubernetes.io/storage-class"
    )
    if storage_class:
        found[f"{storage_class}{STORAGE_CLASS}persistentvolumeclaims"] = ONE
    requested = Quantity.parse(storage_request(claim))
    allocated = Quantity.parse(
        ((claim.get("status") or {}).get("allocatedResources") or {}).get("storage")
    )
    if requested is None:
        return found
    if allocated is not None and allocated.value > requested.value:
        requested = allocated
    # Charged in whole bytes.
    requested = Quantity(Decimal(math.ceil(requested.value)), requested.format)
    found["requests.storage"] = requested
    if storage_class:
        found[f"{storage_class}{STORAGE_CLASS}requests.storage"] = requested
    return found


def _pretty(values: dict[str, Quantity]) -> str:
    return ",".join(f"{name}={values[name]}" for name in sorted(values))


def _quantities(values: Any) -> dict[str, Quantity]:
    """A stored ResourceList (spec.hard, status.used) as quantities."""
    found = {}
    for name, text in (values or {}).items():
        if (amount := Quantity.parse(text)) is not None:
            found[name] = amount
    return found


class Quotas:
    """Quota admission and the quota controller, for one Core (its lock held by the caller);
    `ctx` is the controller's, for its status writes."""

    def __init__(self, core: Core, ctx: Ctx) -> None:
        self.core = core
        self.ctx = ctx
        self.rt = core.builtin("resourcequotas")
        # True while the controller writes a quota's status (that write changes no usage).
        self.writing = False
        # The quotas' names by namespace (`quotas_in`), and the store's dict they index.
        self._names: dict[str, set[str]] = {}
        self._indexed: dict | None = None

    # ---- admission -------------------------------------------------------------------------

    def admit(
        self, rt: ResourceType, obj: dict[str, Any], old: dict[str, Any] | None, subresource: str
    ) -> None:
        """Check a write against the namespace's quotas (raises the 403 the server answers);
        a ResourceQuota's own write gets its spec.hard checked."""
        if rt.key == QUOTAS:
            _prepare_quota(obj, old)
            if old is not None:
                return
            # A new quota is counted as any object is (`resourcequotas`).
        # Subresources (status, scale) are not quota-checked; pods and object counts only on
        # create, claims (storage growth) and Services (type changes) on update too.
        if subresource or not rt.namespaced:
            return
        if old is not None and rt.key not in (CLAIMS, SERVICES):
            return
        ns = obj["metadata"].get("namespace", "")
        quotas = self.quotas_in(ns)
        if not quotas:
            return
        requested = usage(rt.key, obj)
        if old is not None:
            before = usage(rt.key, old)
            requested = {n: q - before.get(n, ZERO) for n, q in requested.items()}
        requested = {n: q for n, q in requested.items() if q.value > 0}
        name = obj["metadata"].get("name", "")
        for quota in quotas:
            status = quota.get("status") or {}
            hard = _quantities(status.get("hard"))
            tracked = {n for n in hard if source_of(n) == rt.key}
            if not tracked:
                continue  # not yet filled in (or naming nothing of this kind): not enforced
            quota_name = quota["metadata"]["name"]
            if rt.key == PODS and (missing := _unstated(obj, tracked & MUST_SPECIFY)):
                raise E.forbidden(
                    rt.plural,
                    rt.group,
                    name,
                    f"failed quota: {quota_name}: must specify {','.join(sorted(missing))}",
                )
            asked = {n: q for n, q in requested.items() if n in tracked}
            used = _quantities(status.get("used"))
            over = [n for n in asked if (used.get(n, ZERO) + asked[n]).value > hard[n].value]
            if over:
                raise E.forbidden(
                    rt.plural,
                    rt.group,
                    name,
                    f"exceeded quota: {quota_name}, "
                    f"requested: {_pretty({n: asked[n] for n in over})}, "
                    f"used: {_pretty({n: used.get(n, ZERO) for n in over})}, "
                    f"limited: {_pretty({n: hard[n] for n in over})}",
                )

    # ---- the quota controller --------------------------------------------------------------

    def quotas_in(self, ns: str) -> list[dict[str, Any]]:
        """The namespace's ResourceQuotas (stored objects: not to be changed), by name. Found
        through an index of their names by namespace, kept by `observe` and made again when the
        store's quotas are another dict (a state loaded): each namespaced write asks, under the
        store's lock, and a scan of every quota grew with the fleet."""
        bucket = self.core.store.objects.get(QUOTAS)
        if not bucket:
            return []
        if bucket is not self._indexed:
            self._names = {}
            for quota_ns, name in bucket:
                self._names.setdefault(quota_ns, set()).add(name)
            self._indexed = bucket
        return [bucket[(ns, n)] for n in sorted(self._names.get(ns, ())) if (ns, n) in bucket]

    def status_of(self, quota: dict[str, Any]) -> dict[str, Any]:
        """status.hard and status.used as the quota controller computes them."""
        hard = _quantities((quota.get("spec") or {}).get("hard"))
        if not hard:
            return {}
        ns = quota["metadata"].get("namespace", "")
        by_source: dict[Key, list[str]] = {}
        for name in hard:
            if (source := source_of(name)) is not None:
                by_source.setdefault(source, []).append(name)
        used = {name: ZERO for names in by_source.values() for name in names}
        for key, names in by_source.items():
            for obj in self.core.store.items(key, ns):
                found = usage(key, obj)
                for name in names:
                    if name in found:
                        used[name] = used[name] + found[name]
        return {
            "hard": {name: str(hard[name]) for name in sorted(hard)},
            "used": {name: str(used[name]) for name in sorted(used)},
        }

    def observe(self, key: Key, new: dict[str, Any] | None, old: dict[str, Any] | None) -> None:
        """An object of `key` went from `old` to `new` (None: absent): bring the status of the
        quotas in its namespace that count it up to date, as the quota controller does at once
        (a MODIFIED event for each that changed). What the object uses is added or taken away,
        so a write costs what it changed; a quota's own write (its spec, or a status someone
        else wrote) is counted again whole."""
        meta = (new if new is not None else old or {})["metadata"]
        if key == QUOTAS and self._indexed is self.core.store.objects.get(QUOTAS):
            names = self._names.setdefault(meta.get("namespace", ""), set())
            (names.add if new is not None else names.discard)(meta["name"])
        if self.writing:
            return  # our own status write: nothing it counts has changed
        ns = meta.get("namespace")
        quotas = self.quotas_in(ns) if ns else []
        if not quotas:
            return
        after = usage(key, new) if new is not None else {}
        before = usage(key, old) if old is not None else {}
        for quota in quotas:
            if key == QUOTAS and quota["metadata"]["name"] == meta["name"]:
                status = self.status_of(quota)
            else:
                status = self._moved(quota, key, after, before)
            if status is None or status == (quota.get("status") or {}):
                continue
            body = {**quota, "status": status}  # update() copies it
            self.writing = True
            try:
                self.core.update(self.rt, ns, quota["metadata"]["name"], body, self.ctx, "status")
            finally:
                self.writing = False

    def _moved(
        self,
        quota: dict[str, Any],
        key: Key,
        after: dict[str, Quantity],
        before: dict[str, Quantity],
    ) -> dict[str, Any] | None:
        """The quota's status once an object of `key` used `after` instead of `before`; None
        if that changes nothing it counts."""
        status = quota.get("status") or {}
        if not status.get("hard"):
            # Never counted (written before the sandbox kept quotas): count it whole.
            names = (quota.get("spec") or {}).get("hard") or {}
            return self.status_of(quota) if any(source_of(n) == key for n in names) else None
        changes = {}
        for name in status["hard"]:
            if source_of(name) == key:
                change = after.get(name, ZERO) - before.get(name, ZERO)
                if change.value:
                    changes[name] = change
        if not changes:
            return None
        used = _quantities(status.get("used"))
        for name, change in changes.items():
            used[name] = used.get(name, ZERO) + change
        return {**status, "used": {name: str(used[name]) for name in sorted(used)}}


def _prepare_quota(quota: dict[str, Any], old: dict[str, Any] | None) -> None:
    """Check spec.hard as decoding and ValidateResourceQuota do, and keep it in the canonical
    form the server answers; a new quota's status starts empty, for the controller to fill."""
    name = quota["metadata"].get("name", "")
    hard = (quota.get("spec") or {}).get("hard")
    if isinstance(hard, dict):
        errs = []
        for resource, text in sorted(hard.items()):
            amount = Quantity.parse(text)
            if amount is None:
                raise E.bad_request(
                    'ResourceQuota in version "v1" cannot be handled as a ResourceQuota: '
                    + QUANTITY_FORMAT
                )
            path = f"spec.hard[{resource}]"
            if amount.value < 0:
                errs.append(E.invalid(path, str(amount), "must be greater than or equal to 0"))
            elif resource in INTEGER_NAMES and amount.value != int(amount.value):
                errs.append(E.invalid(path, str(amount), "must be an integer"))
            hard[resource] = str(amount)
        if errs:
            raise E.invalid_object("ResourceQuota", "", name, errs)
    if old is None:
        quota.pop("status", None)


def _unstated(pod: dict[str, Any], required: set[str]) -> set[str]:
    """The resources in `required` some container of the pod does not state."""
    missing: set[str] = set()
    spec = pod.get("spec") or {}
    for container in (spec.get("containers") or []) + (spec.get("initContainers") or []):
        missing |= required - set(_container_usage(container))
    return missing
