"""What a run sees of its instance and cell: the `$sys` variables and the namespace made for it.

Plain values in, plain values out, no database: the runner fills them from its rows, and
`spec_test` from the pretend cell it runs a spec against, so both build runs the same way.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from deployments.schedules import DEFAULT_RETENTION_DAYS
from deployments.spec.model import Workflow
from deployments.workflow.driver import Driver, TransientError
from deployments.workflow.render import Context, RenderError, render_value

# The Secret, in every instance namespace, holding the cell's object-store credentials.
BACKUP_CREDENTIALS_NAME = "opsdeck-backup-credentials"


def sys_variables(
    *,
    instance_id: str,
    namespace: str,
    tenant_slug: str,
    tenant_name: str,
    user_id: str = "",
    user_email: str = "",
    region: str = "",
    cloud: str = "",
    labels: dict[str, Any] | None = None,
    backup_destination: str = "",
    backup_retention_days: int = DEFAULT_RETENTION_DAYS,
    parameters: dict[str, Any] | None = None,
    operation_id: str = "",
    started_at: datetime | None = None,
    endpoint: dict[str, Any] | None = None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The `$sys` mapping of one run (docs/spec-format.md, "Variables").

    `labels` are the cell's (networkID, cidrRange, publicSubnetIDs, privateSubnetIDs);
    `parameters` are the values the run renders with, whose `instanceType`, if any, is the
    node's instance type; `backup_retention_days` is how long the object store keeps backups
    (the instance's backup schedule, else the plan's `backupRetentionInDays`); `endpoint` is
    the main service's primary endpoint (`Service.primary_endpoint()`), whose host gives
    `network.externalClusterEndpoint`; `extra` (e.g. `snapshot`, `restore`) is merged in last.
    """
    labels = labels or {}
    destination = backup_destination.rstrip("/")
    instance_type = (parameters or {}).get("instanceType", "")
    endpoint_at = endpoint_name(endpoint or {}, instance_id=instance_id, namespace=namespace)
    return {
        "id": instance_id,
        "instanceId": instance_id,
        "namespace": namespace,
        "tenant": {
            "orgId": tenant_slug,
            "orgName": tenant_name,
            "userID": user_id,
            "email": user_email,
        },
        "deploymentCell": {
            "region": region,
            "cloudProviderName": cloud,
            "cloudProviderNetworkID": labels.get("networkID", ""),
            "cidrRange": labels.get("cidrRange", ""),
            "publicSubnetIDs": [{"id": s} for s in labels.get("publicSubnetIDs", [])],
            "privateSubnetIDs": [{"id": s} for s in labels.get("privateSubnetIDs", [])],
        },
        "backup": {
            "destinationPath": f"{destination}/{tenant_slug}/{instance_id}" if destination else "",
            "credentialsSecret": BACKUP_CREDENTIALS_NAME,
            "retentionDays": backup_retention_days,
        },
        "compute": {"node": {"instanceType": str(instance_type)}},
        "deployment": {"resourceID": instance_id},
        "network": {"externalClusterEndpoint": endpoint_at},
        "deterministicSeedValue": instance_id,
        "operation": {
            "id": operation_id,
            # RFC 3339 in whole seconds, as Kubernetes writes its own timestamps, so specs can
            # compare it with a condition's lastTransitionTime.
            "startedAt": started_at.strftime("%Y-%m-%dT%H:%M:%SZ") if started_at else "",
        },
        **(extra or {}),
    }


def endpoint_name(endpoint: dict[str, Any], *, instance_id: str, namespace: str) -> str:
    """`$sys.network.externalClusterEndpoint`: the endpoint's `host` rendered as a spec template
    is, with `$sys.id`, `$sys.instanceId` and `$sys.namespace`, and qualified with the namespace
    when it has no dot (a Service name resolves cluster-wide as `<name>.<namespace>`). When the
    host is missing or needs more (Omnistrate specs write `host: $sys.network.
    externalClusterEndpoint`, leaving the name to the platform): `<instance id>.<namespace>`."""
    sys = {"id": instance_id, "instanceId": instance_id, "namespace": namespace}
    host = _render_host(endpoint, sys)
    if not host:
        return f"{instance_id}.{namespace}"
    return host if "." in host else f"{host}.{namespace}"


def endpoint_host(endpoint: dict[str, Any], *, instance_id: str, namespace: str) -> str:
    """The endpoint's `host` as the Connection tab shows it, rendered like `endpoint_name`
    (where it may also use that name) and qualified with the namespace in the same way
    (`"{{ $sys.id }}-rw"` → `inst-a1b2c3d4-rw.inst-a1b2c3d4`): customers connect from
    namespaces of their own, where a Service's bare name does not resolve. "" when it has
    none or refers to anything else."""
    name = endpoint_name(endpoint, instance_id=instance_id, namespace=namespace)
    sys = {
        "id": instance_id,
        "instanceId": instance_id,
        "namespace": namespace,
        "network": {"externalClusterEndpoint": name},
    }
    host = _render_host(endpoint, sys)
    return host if not host or "." in host else f"{host}.{namespace}"


def _render_host(endpoint: dict[str, Any], sys: dict[str, Any]) -> str:
    host = endpoint.get("host")
    if not isinstance(host, str) or not host:
        return ""
    try:
        return str(render_value(host, Context(var={}, sys=sys, seed=sys["id"])))
    except RenderError:
        return ""


def run_context(
    workflow: Workflow, *, verb: str, values: dict[str, Any], sys: dict[str, Any], seed: str
) -> Context:
    """The variables a run renders with: `$var`, `$sys` and the workflow's rendered arguments.

    Raises RenderError when an argument refers to something that does not exist.
    """
    base = Context(var=values, sys=sys, seed=seed)
    arguments = {
        name: render_value(value, base, where=f"{verb}.workflow.arguments.{name}")
        for name, value in workflow.arguments.items()
    }
    return Context(var=values, sys=sys, workflow=arguments, seed=seed)


def namespace_objects(
    *,
    namespace: str,
    instance_id: str,
    tenant_slug: str,
    extensions: dict[str, Any],
    endpoint: dict[str, Any] | None = None,
    operator_namespace: str = "",
    customer_sources: list[str],
    backup_credentials: dict[str, str] | None,
) -> list[dict[str, Any]]:
    """The instance's namespace and its guard rails, in the order they are applied.

    `extensions` is the spec's `x-opsdeck` (its `quota.storage`, `network.port` and `operator`);
    `endpoint` is the main service's primary endpoint, whose ports customers reach unless
    `network.port` names one; `operator_namespace` is the cell's override of
    `x-opsdeck.operator.namespace` ("" keeps the spec's); `backup_credentials`, when given,
    becomes the Secret `$sys.backup.credentialsSecret` names.
    """
    ns = namespace
    labels = {"opsdeck.io/tenant": tenant_slug, "opsdeck.io/instance": instance_id}
    objects: list[dict[str, Any]] = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns, "labels": labels}}
    ]
    quota = {"persistentvolumeclaims": "20", "services": "20", "secrets": "50", "configmaps": "50"}
    storage = (extensions.get("quota") or {}).get("storage")
    if storage:
        quota["requests.storage"] = str(storage)
    objects.append({
        "apiVersion": "v1", "kind": "ResourceQuota",
        "metadata": {"name": "opsdeck-quota", "namespace": ns},
        "spec": {"hard": quota},
    })  # fmt: skip
    objects.append({
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"name": "opsdeck-isolation", "namespace": ns},
        "spec": {"podSelector": {}, "policyTypes": ["Ingress"], "ingress": _ingress(
            extensions, endpoint or {}, operator_namespace, customer_sources)},
    })  # fmt: skip
    if backup_credentials:
        objects.append({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": BACKUP_CREDENTIALS_NAME, "namespace": ns},
            "stringData": backup_credentials,
        })  # fmt: skip
    return objects


def _ingress(
    extensions: dict[str, Any],
    endpoint: dict[str, Any],
    operator_namespace: str,
    customer_sources: list[str],
) -> list[dict[str, Any]]:
    """Who may reach the instance's pods: each other; the operator's namespace on the ports
    `x-opsdeck.operator` names (every port when it names none); customers on the plan's port."""
    ingress: list[dict[str, Any]] = [{"from": [{"podSelector": {}}]}]
    operator = extensions.get("operator") or {}
    operator_namespace = operator_namespace or operator.get("namespace", "")
    if operator_namespace:
        rule: dict[str, Any] = {"from": [{"namespaceSelector": {"matchLabels": {
            "kubernetes.io/metadata.name": operator_namespace}}}]}  # fmt: skip
        if operator.get("ports"):
            rule["ports"] = [{"port": int(port)} for port in operator["ports"]]
        ingress.append(rule)
    network = extensions.get("network") or {}
    ports = [network["port"]] if "port" in network else endpoint.get("ports") or []
    if customer_sources and ports:
        ingress.append({
            "from": [{"ipBlock": {"cidr": cidr}} for cidr in customer_sources],
            "ports": [{"port": int(port)} for port in ports],
        })  # fmt: skip
    return ingress


def namespace_delete(driver: Driver, namespace: str) -> None:
    """Delete the instance's namespace (after its delete workflow succeeded). A namespace being
    deleted already (a first delete whose answer was lost, a move done again) answers another
    with 409 Conflict while the cluster removes what it holds: it is going all the same."""
    obj = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
    try:
        driver.delete(obj)
    except TransientError:
        current = driver.get(obj)
        if current is not None and not (current.get("metadata") or {}).get("deletionTimestamp"):
            raise
