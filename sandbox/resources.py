"""The kinds the sandbox serves: built-in core kinds and those defined by CRDs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

ALL_VERBS = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]


@dataclass
class ResourceType:
    """One served resource (group, version, plural) and what the server knows of it."""

    group: str
    version: str
    plural: str
    singular: str
    kind: str
    namespaced: bool = True
    short_names: list[str] = field(default_factory=list)
    categories: list[str] = field(default_factory=list)
    status: bool = False
    scale: dict[str, Any] | None = None
    printer_columns: list[dict[str, Any]] = field(default_factory=list)
    schema: dict[str, Any] | None = None
    crd: bool = False
    # Core kinds whose spec changes bump metadata.generation.
    has_generation: bool = False

    @property
    def group_version(self) -> str:
        """`v1` for the core group, else `group/version`."""
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def key(self) -> tuple[str, str]:
        """Storage key: objects are shared by every served version."""
        return (self.group, self.plural)

    @property
    def list_kind(self) -> str:
        """The kind of a list of these objects."""
        return self.kind + "List"

    def api_resource(self) -> list[dict[str, Any]]:
        """APIResourceList entries for discovery (the resource and its subresources)."""
        entry: dict[str, Any] = {
            "name": self.plural,
            "singularName": self.singular,
            "namespaced": self.namespaced,
            "kind": self.kind,
            "verbs": ALL_VERBS
            if self.plural != "namespaces"
            else [v for v in ALL_VERBS if v != "deletecollection"],
        }
        if self.short_names:
            entry["shortNames"] = self.short_names
        if self.categories:
            entry["categories"] = self.categories
        entries = [entry]
        if self.status:
            entries.append(
                {
                    "name": f"{self.plural}/status",
                    "singularName": "",
                    "namespaced": self.namespaced,
                    "kind": self.kind,
                    "verbs": ["get", "patch", "update"],
                }
            )
        if self.scale is not None:
            entries.append(
                {
                    "name": f"{self.plural}/scale",
                    "singularName": "",
                    "namespaced": self.namespaced,
                    "group": "autoscaling",
                    "version": "v1",
                    "kind": "Scale",
                    "verbs": ["get", "patch", "update"],
                }
            )
        return entries


def _core(
    plural: str,
    kind: str,
    *,
    group: str = "",
    version: str = "v1",
    namespaced: bool = True,
    short: list[str] | None = None,
    status: bool = False,
    generation: bool = False,
    scale: dict[str, Any] | None = None,
    categories: list[str] | None = None,
) -> ResourceType:
    return ResourceType(
        group=group,
        version=version,
        plural=plural,
        singular=kind.lower(),
        kind=kind,
        namespaced=namespaced,
        short_names=short or [],
        categories=categories or [],
        status=status,
        scale=scale,
        has_generation=generation,
    )


def builtin_types() -> list[ResourceType]:
    """The built-in kinds Opsdeck and the simulated operators use."""
    return [
        _core("namespaces", "Namespace", namespaced=False, short=["ns"], status=True),
        _core("secrets", "Secret"),
        _core("configmaps", "ConfigMap", short=["cm"]),
        _core("services", "Service", short=["svc"], status=True, categories=["all"]),
        _core("pods", "Pod", short=["po"], status=True, generation=True, categories=["all"]),
        _core("persistentvolumeclaims", "PersistentVolumeClaim", short=["pvc"], status=True),
        _core("serviceaccounts", "ServiceAccount", short=["sa"]),
        _core("resourcequotas", "ResourceQuota", short=["quota"], status=True),
        _core("limitranges", "LimitRange", short=["limits"]),
        _core("events", "Event", short=["ev"]),
        _core("endpoints", "Endpoints", short=["ep"]),
        _core("roles", "Role", group="rbac.authorization.k8s.io"),
        _core("rolebindings", "RoleBinding", group="rbac.authorization.k8s.io"),
        _core("clusterroles", "ClusterRole", group="rbac.authorization.k8s.io", namespaced=False),
        _core(
            "clusterrolebindings",
            "ClusterRoleBinding",
            group="rbac.authorization.k8s.io",
            namespaced=False,
        ),
        _core(
            "statefulsets",
            "StatefulSet",
            group="apps",
            short=["sts"],
            status=True,
            generation=True,
            categories=["all"],
            # The Scale's status.selector is spec.selector written as a selector string.
            scale={
                "specReplicasPath": ".spec.replicas",
                "statusReplicasPath": ".status.replicas",
                "labelSelectorPath": ".spec.selector",
            },
        ),
        _core("controllerrevisions", "ControllerRevision", group="apps"),
        _core("networkpolicies", "NetworkPolicy", group="networking.k8s.io", short=["netpol"]),
        _core(
            "customresourcedefinitions",
            "CustomResourceDefinition",
            group="apiextensions.k8s.io",
            namespaced=False,
            short=["crd", "crds"],
            status=True,
            generation=True,
        ),
    ]


def types_from_crd(crd: dict[str, Any]) -> list[ResourceType]:
    """The resource types a CustomResourceDefinition serves (one per served version)."""
    spec = crd.get("spec") or {}
    names = spec.get("names") or {}
    out = []
    for version in spec.get("versions") or []:
        if not version.get("served", True):
            continue
        subresources = version.get("subresources") or {}
        out.append(
            ResourceType(
                group=spec.get("group", ""),
                version=version.get("name", ""),
                plural=names.get("plural", ""),
                singular=names.get("singular") or names.get("kind", "").lower(),
                kind=names.get("kind", ""),
                namespaced=spec.get("scope", "Namespaced") == "Namespaced",
                short_names=list(names.get("shortNames") or []),
                categories=list(names.get("categories") or []),
                status="status" in subresources,
                scale=subresources.get("scale"),
                printer_columns=list(version.get("additionalPrinterColumns") or []),
                schema=(version.get("schema") or {}).get("openAPIV3Schema"),
                crd=True,
                has_generation=True,
            )
        )
    return out
