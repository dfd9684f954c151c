"""What a run sees of its instance and cell: the `$sys` variables and the namespace made for it.

Plain values in, plain values out, no database: the runner fills them from its rows, and
`spec_test` from the pretend cell it runs a spec against, so both build runs the same way.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from deployments.kube import KubeDriver
from deployments.schedules import DEFAULT_RETENTION_DAYS
from deployments.spec.model import Workflow
from deployments.workflow.render import Context, render_value

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
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The `$sys` mapping of one run (docs/spec-format.md, "Variables").

    `labels` are the cell's (networkID, cidrRange, publicSubnetIDs, privateSubnetIDs);
    `parameters` are the values the run renders with, whose `instanceType`, if any, is the
    node's instance type; `backup_retention_days` is how long the object store keeps backups
    (the instance's backup schedule, else the plan's `backupRetentionInDays`); `extra` (e.g.
    `snapshot`, `restore`) is merged in last.
    """
    labels = labels or {}
    destination = backup_destination.rstrip("/")
    instance_type = (parameters or {}).get("instanceType", "")
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
        "network": {"externalClusterEndpoint": f"{instance_id}-rw.{namespace}"},
        "deterministicSeedValue": instance_id,
        "operation": {
            "id": operation_id,
            # RFC 3339 in whole seconds, as Kubernetes writes its own timestamps, so specs can
            # compare it with a condition's lastTransitionTime.
            "startedAt": started_at.strftime("%Y-%m-%dT%H:%M:%SZ") if started_at else "",
        },
        **(extra or {}),
    }


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
    operator_namespace: str,
    customer_sources: list[str],
    backup_credentials: dict[str, str] | None,
) -> list[dict[str, Any]]:
    """The instance's namespace and its guard rails, in the order they are applied.

    `extensions` is the spec's `x-opsdeck` (its `quota.storage` and `network.port`);
    `backup_credentials`, when given, becomes the Secret `$sys.backup.credentialsSecret` names.
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
    port = int((extensions.get("network") or {}).get("port", 5432))
    ingress = [
        {"from": [{"podSelector": {}}]},
        {
            "from": [{"namespaceSelector": {"matchLabels": {
                "kubernetes.io/metadata.name": operator_namespace}}}],
            "ports": [{"port": 8000}, {"port": 5432}],
        },
    ]  # fmt: skip
    if customer_sources:
        ingress.append({
            "from": [{"ipBlock": {"cidr": cidr}} for cidr in customer_sources],
            "ports": [{"port": port}],
        })  # fmt: skip
    objects.append({
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"name": "opsdeck-isolation", "namespace": ns},
        "spec": {"podSelector": {}, "policyTypes": ["Ingress"], "ingress": ingress},
    })  # fmt: skip
    if backup_credentials:
        objects.append({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": BACKUP_CREDENTIALS_NAME, "namespace": ns},
            "stringData": backup_credentials,
        })  # fmt: skip
    return objects


def namespace_prepare(driver: KubeDriver, **values: Any) -> None:
    """Apply every object of `namespace_objects(**values)` (server-side apply: idempotent)."""
    for obj in namespace_objects(**values):
        driver.apply(obj)


def namespace_delete(driver: KubeDriver, namespace: str) -> None:
    """Delete the instance's namespace (after its delete workflow succeeded)."""
    driver.delete({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
