"""API semantics independent of HTTP: create, read, update, patch, delete, watch, GC."""

from __future__ import annotations

import base64
import binascii
import contextlib
import copy
import datetime as dt
import json
import re
import secrets
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from . import builtin_schema, workloads
from . import errors as E
from . import patch as P
from . import schema as S
from .garbage import GcIndex
from .logs import PodLogs
from .quota import CONTROLLER as QUOTA_CONTROLLER
from .quota import Quotas
from .resources import ResourceType, builtin_types, types_from_crd
from .selectors import label_selector_string, parse_field_selector, parse_label_selector
from .store import Event, Store

JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"
CR_PATCH_TYPES = [JSON_PATCH, MERGE_PATCH, APPLY_PATCH]

_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS1123_SUBDOMAIN = re.compile(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
)
_DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
LABEL_MSG = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', "
    "and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', "
    "regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
)
SUBDOMAIN_MSG = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' "
    "or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex "
    "used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
)
DNS1035_MSG = (
    "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an "
    "alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or "
    "'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')"
)
TERMINATING = "unable to create new content in namespace {ns} because it is being terminated"
# Deleting these answers the object itself, as the real registry does.
RETURN_DELETED = {"pods", "services", "namespaces"}
EVENT_TTL_SECONDS = 3600


def now_iso() -> str:
    """Current UTC time as Kubernetes prints it (RFC 3339, seconds)."""
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class Ctx:
    """Per-request options that change how a write is handled."""

    field_manager: str = ""
    dry_run: bool = False
    field_validation: str = "Warn"
    user_agent: str = ""
    force: bool = False
    warnings: list[str] = field(default_factory=list)
    # Keys the request body repeated (JSON only), reported like unknown fields.
    duplicates: list[str] = field(default_factory=list)

    def manager(self) -> str:
        """The field manager: the explicit one, else derived from the User-Agent like the server."""
        if self.field_manager:
            return self.field_manager
        agent = self.user_agent.split("/")[0] if self.user_agent else "unknown"
        return agent or "unknown"


@dataclass
class WatchEvent:
    """An event ready to be sent to one watcher."""

    type: str
    object: dict[str, Any]


class Core:
    """The object model of the API server, shared by the HTTP layer and the simulated operators."""

    def __init__(self, store: Store | None = None) -> None:
        self.store = store or Store()
        self.lock = self.store.lock
        self.gc_index = GcIndex(self.store)
        self.types: dict[tuple[str, str, str], ResourceType] = {}
        self.bookmark_seconds = 5.0
        # Mutating admission (an operator's defaulting webhook), by (group, plural).
        self.defaulters: dict[tuple[str, str], Callable[[dict[str, Any]], None]] = {}
        # Validating admission (an operator's validating webhook), by (group, plural): the
        # webhook's name, and what it finds wrong with a new object (`old`: None on create).
        self.validators: dict[
            tuple[str, str], tuple[str, Callable[[dict[str, Any], dict[str, Any] | None], list]]
        ] = {}
        self.closing = False
        # Container logs of the simulated pods (the kubelet's part of `pods/{name}/log`).
        self.logs = PodLogs()
        for rt in builtin_types():
            self.types[(rt.group, rt.version, rt.plural)] = rt
        # ResourceQuota admission, and the quota controller keeping their status current.
        self.quotas = Quotas(self, Ctx(field_manager=QUOTA_CONTROLLER))

    # ---- registry --------------------------------------------------------------------------

    def builtin(self, plural: str) -> ResourceType:
        """A built-in resource type by plural (they are always served)."""
        for rt in self.types.values():
            if rt.plural == plural and not rt.crd:
                return rt
        raise KeyError(plural)

    def resolve(self, group: str, version: str, plural: str) -> ResourceType | None:
        """The resource type served at group/version/plural, if any."""
        return self.types.get((group, version, plural))

    def groups(self) -> dict[str, list[str]]:
        """Served groups (core excluded) and their versions, in registration order."""
        out: dict[str, list[str]] = {}
        for rt in self.types.values():
            if rt.group and rt.version not in out.setdefault(rt.group, []):
                out[rt.group].append(rt.version)
        return out

    def resources_in(self, group: str, version: str) -> list[ResourceType]:
        """Resource types of one group/version."""
        return [rt for rt in self.types.values() if rt.group == group and rt.version == version]

    def sync_crd(self, crd: dict[str, Any], removed: bool = False) -> None:
        """Serve (or stop serving, dropping its objects) the resources a CRD defines."""
        group = (crd.get("spec") or {}).get("group", "")
        plural = ((crd.get("spec") or {}).get("names") or {}).get("plural", "")
        for k in [k for k in self.types if k[0] == group and k[2] == plural and self.types[k].crd]:
            del self.types[k]
        if removed:
            self.store.objects.pop((group, plural), None)
            return
        for rt in types_from_crd(crd):
            self.types[(rt.group, rt.version, rt.plural)] = rt

    # ---- reads -----------------------------------------------------------------------------

    def get(self, rt: ResourceType, ns: str, name: str) -> dict[str, Any]:
        """One object, or 404."""
        with self.lock:
            obj = self.store.get(rt.key, ns, name)
            if obj is None:
                raise E.not_found(rt.plural, rt.group, name)
            return self._out(rt, obj)

    def _out(self, rt: ResourceType, obj: dict[str, Any]) -> dict[str, Any]:
        out = copy.deepcopy(obj)
        out["apiVersion"] = rt.group_version
        out["kind"] = rt.kind
        return out

    @staticmethod
    def _view(rt: ResourceType, obj: dict[str, Any]) -> dict[str, Any]:
        """A read-only view for serialising (stored objects are never changed in place)."""
        return {**obj, "apiVersion": rt.group_version, "kind": rt.kind}

    @classmethod
    def _item(cls, rt: ResourceType, obj: dict[str, Any]) -> dict[str, Any]:
        """An item of a list, as the API server encodes it: a custom resource with its
        apiVersion and kind, a built-in kind's without (the list's kind names them)."""
        if rt.crd:
            return cls._view(rt, obj)
        return {key: value for key, value in obj.items() if key not in ("apiVersion", "kind")}

    def list(
        self,
        rt: ResourceType,
        ns: str | None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        limit: int = 0,
        cont: str | None = None,
    ) -> dict[str, Any]:
        """A list with its snapshot resourceVersion; limit/continue page through one snapshot.

        Items are read-only views of the stored objects: copy before changing them.
        """
        labels = parse_label_selector(label_selector)
        fields = parse_field_selector(field_selector, rt.plural, rt.kind)
        with self.lock:
            start: tuple[str, str] | None = None
            if cont:
                snap_rv, start = _decode_continue(cont)
                if snap_rv == _LATEST:  # a token a 410 gave: the rest, as it is now
                    snap_rv = self.store.rv
                    state = self.store.objects.get(rt.key, {})
                elif snap_rv < self.store.compacted_rv:
                    # As kube-apiserver: with a token that goes on from the same key in the
                    # current state, an inconsistent list the client may choose.
                    raise E.gone(
                        "The provided continue parameter is too old to display a consistent list "
                        "result. You can start a new list without the continue parameter, or use "
                        "the continue token in this response to retrieve the remainder of the "
                        "results. Continuing with the provided token results in an inconsistent "
                        "list - objects that were created, modified, or deleted between the time "
                        "the first chunk was returned and now may show up in the list.",
                        continue_token=_encode_continue(_LATEST, start),
                    )
                else:
                    state = self.store.snapshot(rt.key, snap_rv)
            else:
                snap_rv = self.store.rv
                state = self.store.objects.get(rt.key, {})
            keys = sorted(k for k in state if ns is None or k[0] == ns)
            if start is not None:
                keys = [k for k in keys if k > start]
            matching = [
                k
                for k in keys
                if labels(state[k]["metadata"].get("labels") or {}) and fields(state[k])
            ]
            meta: dict[str, Any] = {"resourceVersion": str(snap_rv)}
            page = matching[:limit] if limit > 0 else matching
            if len(page) < len(matching):
                meta["continue"] = _encode_continue(snap_rv, page[-1])
                meta["remainingItemCount"] = len(matching) - len(page)
            items = [self._item(rt, state[k]) for k in page]
            return {
                "apiVersion": rt.group_version,
                "kind": rt.list_kind,
                "metadata": meta,
                "items": items,
            }

    # ---- writes ----------------------------------------------------------------------------

    def create(
        self,
        rt: ResourceType,
        ns: str,
        body: Any,
        ctx: Ctx | None = None,
        operation: str = "Update",
    ) -> dict[str, Any]:
        """POST: create an object (server-side apply creates through here too)."""
        ctx = ctx or Ctx()
        obj = self._check_body(rt, body)
        meta = obj.setdefault("metadata", {})
        if not isinstance(meta, dict):
            raise E.bad_request("metadata must be an object")
        if rt.namespaced:
            if meta.get("namespace") and meta["namespace"] != ns:
                raise E.bad_request(
                    "the namespace of the provided object does not match the namespace sent on "
                    "the request"
                )
            meta["namespace"] = ns
        else:
            meta.pop("namespace", None)
        with self.lock:
            if not meta.get("name") and meta.get("generateName"):
                meta["name"] = self._generate_name(rt, ns, meta["generateName"])
            name = meta.get("name") or ""
            self._validate_meta(rt, obj, name)
            if rt.namespaced:
                self._check_namespace(rt, ns, name)
            if self.store.get(rt.key, ns if rt.namespaced else "", name) is not None:
                raise E.already_exists(rt.plural, rt.group, name)
            for k in (
                "uid",
                "resourceVersion",
                "creationTimestamp",
                "deletionTimestamp",
                "managedFields",
                "selfLink",
            ):
                meta.pop(k, None)
            meta["uid"] = str(uuid.uuid4())
            meta["creationTimestamp"] = now_iso()
            if rt.has_generation:
                meta["generation"] = 1
            else:
                meta.pop("generation", None)
            if rt.status and rt.crd:
                # A custom resource's status is not writable on create (status subresource).
                obj.pop("status", None)
            self._prepare(rt, obj, None, ctx)
            self.quotas.admit(rt, obj, None, "")
            self._set_managed(
                rt, obj, None, ctx, operation, None, body if operation == "Apply" else None
            )
            if ctx.dry_run:
                return self._out(rt, obj)
            self._commit(rt, obj, None)
            return self._out(rt, obj)

    def update(
        self,
        rt: ResourceType,
        ns: str,
        name: str,
        body: Any,
        ctx: Ctx | None = None,
        subresource: str = "",
    ) -> dict[str, Any]:
        """PUT: replace an object (or its status) with optimistic concurrency."""
        ctx = ctx or Ctx()
        obj = self._check_body(rt, body)
        meta = obj.setdefault("metadata", {})
        if meta.get("name") and meta["name"] != name:
            raise _name_mismatch(meta["name"], name)
        meta["name"] = name
        if rt.namespaced:
            if meta.get("namespace") and meta["namespace"] != ns:
                raise E.bad_request(
                    "the namespace of the provided object does not match the namespace sent on "
                    "the request"
                )
            meta["namespace"] = ns
        with self.lock:
            old = self.store.get(rt.key, ns if rt.namespaced else "", name)
            if old is None:
                raise E.not_found(rt.plural, rt.group, name)
            rv = meta.get("resourceVersion")
            if not rv and rt.crd:
                # Custom resources do not allow unconditional updates.
                raise E.invalid_object(
                    rt.kind,
                    rt.group,
                    name,
                    [
                        E.invalid(
                            "metadata.resourceVersion",
                            E.RawValue("0x0"),
                            "must be specified for an update",
                        )
                    ],
                )
            if rv and rv != old["metadata"]["resourceVersion"]:
                raise E.stale(rt.plural, rt.group, name)
            return self._replace(rt, old, obj, ctx, subresource, "Update")

    def _replace(
        self,
        rt: ResourceType,
        old: dict[str, Any],
        obj: dict[str, Any],
        ctx: Ctx,
        subresource: str,
        operation: str,
        applied: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Shared tail of update and patch: carry server fields, isolate status, validate, store."""
        meta = obj["metadata"]
        old_meta = old["metadata"]
        if subresource == "status":
            # Writes to /status change only .status.
            new = copy.deepcopy(old)
            if "status" in obj:
                new["status"] = obj["status"]
            else:
                new.pop("status", None)
            obj, meta = new, new["metadata"]
        else:
            for k in (
                "uid",
                "creationTimestamp",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
            ):
                if k in old_meta:
                    meta[k] = old_meta[k]
                else:
                    meta.pop(k, None)
            if rt.status:
                # With a status subresource, writes to the main resource ignore .status.
                if "status" in old:
                    obj["status"] = copy.deepcopy(old["status"])
                else:
                    obj.pop("status", None)
        # kube-apiserver checks them on every update of the object, not on its create alone.
        if errs := _labels_and_annotations_problems(meta):
            raise E.invalid_object(rt.kind, rt.group, meta.get("name", ""), errs)
        meta["resourceVersion"] = old_meta["resourceVersion"]
        if "managedFields" not in meta and old_meta.get("managedFields"):
            meta["managedFields"] = copy.deepcopy(old_meta["managedFields"])
        self._prepare(rt, obj, old, ctx, admitted=not subresource)
        self.quotas.admit(rt, obj, old, subresource)
        if rt.has_generation:
            # Compared after defaulting, so omitting a defaulted field is not a spec change.
            meta["generation"] = old_meta.get("generation", 1)
            if _spec_part(obj) != _spec_part(old):
                meta["generation"] += 1
        else:
            meta.pop("generation", None)
        self._set_managed(rt, obj, old, ctx, operation, subresource or None, applied)
        if _strip_times(obj) == _strip_times(old):
            # A no-op write stores nothing and keeps the resourceVersion.
            return self._out(rt, old)
        if old_meta.get("deletionTimestamp"):
            new_fin = meta.get("finalizers") or []
            for f in new_fin:
                if f not in (old_meta.get("finalizers") or []):
                    raise E.forbidden(
                        rt.plural,
                        rt.group,
                        meta["name"],
                        "no new finalizers can be added if the object is being deleted, found new "
                        f"finalizers []string{{{json.dumps(f)}}}",
                    )
        if ctx.dry_run:
            return self._out(rt, obj)
        self._commit(rt, obj, old)
        return self._out(rt, obj)

    def patch(
        self,
        rt: ResourceType,
        ns: str,
        name: str,
        content_type: str,
        body: Any,
        ctx: Ctx | None = None,
        subresource: str = "",
    ) -> dict[str, Any]:
        """PATCH with a JSON, merge, strategic-merge or apply patch."""
        ctx = ctx or Ctx()
        if content_type == STRATEGIC_PATCH and rt.crd:
            raise E.unsupported_media_type(content_type, CR_PATCH_TYPES)
        if content_type not in (JSON_PATCH, MERGE_PATCH, STRATEGIC_PATCH, APPLY_PATCH):
            accepted = (
                CR_PATCH_TYPES
                if rt.crd
                else [JSON_PATCH, MERGE_PATCH, APPLY_PATCH, STRATEGIC_PATCH]
            )
            raise E.unsupported_media_type(content_type, accepted)
        if content_type == APPLY_PATCH:
            return self.apply(rt, ns, name, body, ctx, subresource)
        with self.lock:
            old = self.store.get(rt.key, ns if rt.namespaced else "", name)
            if old is None:
                raise E.not_found(rt.plural, rt.group, name)
            current = self._out(rt, old)
            if content_type == JSON_PATCH:
                patched = P.json_patch(current, body)
            elif content_type == MERGE_PATCH:
                if not isinstance(body, dict):
                    raise E.bad_request(
                        "json: cannot unmarshal array into Go value of type map[string]interface {}"
                    )
                patched = P.merge_patch(current, body)
            else:
                if not isinstance(body, dict):
                    raise E.bad_request(
                        "json: cannot unmarshal array into Go value of type map[string]interface {}"
                    )
                patched = P.strategic_merge(current, body)
            if not isinstance(patched, dict):
                raise E.bad_request("the patch did not produce an object")
            meta = patched.setdefault("metadata", {})
            if not isinstance(meta, dict):
                raise E.bad_request("metadata must be an object")
            if meta.get("name") != name:
                raise _name_mismatch(meta.get("name"), name)
            if meta.get("resourceVersion") != old["metadata"]["resourceVersion"]:
                raise E.stale(rt.plural, rt.group, name)
            patched.setdefault("apiVersion", rt.group_version)
            patched.setdefault("kind", rt.kind)
            self.check_types(rt, patched)
            return self._replace(rt, old, patched, ctx, subresource, "Update")

    def apply(
        self,
        rt: ResourceType,
        ns: str,
        name: str,
        body: Any,
        ctx: Ctx,
        subresource: str = "",
    ) -> dict[str, Any]:
        """Server-side apply: merge the applied configuration and track field ownership."""
        if not ctx.field_manager:
            raise E.invalid_object(
                "PatchOptions",
                "meta.k8s.io",
                "",
                [E.required("fieldManager", "is required for apply patch")],
            )
        if not isinstance(body, dict):
            raise E.bad_request("error decoding YAML: the applied configuration must be an object")
        builtin_schema.check_apply(rt, body)
        self.check_types(rt, body)
        config = copy.deepcopy(body)
        if not config.get("apiVersion") or not config.get("kind"):
            raise E.bad_request("invalid object type: /, Kind=")
        cmeta = config.setdefault("metadata", {})
        if cmeta.get("name") and cmeta["name"] != name:
            raise _name_mismatch(cmeta["name"], name)
        cmeta["name"] = name
        if rt.namespaced:
            cmeta["namespace"] = ns
        keys = self._keys(rt)
        manager = ctx.field_manager
        with self.lock:
            old = self.store.get(rt.key, ns if rt.namespaced else "", name)
            if old is None:
                if subresource:
                    raise E.not_found(rt.plural, rt.group, name)
                # Server-side apply creates a missing object.
                return self.create(rt, ns, config, ctx, "Apply")
            if (
                cmeta.get("resourceVersion")
                and cmeta["resourceVersion"] != old["metadata"]["resourceVersion"]
            ):
                raise E.stale(rt.plural, rt.group, name)
            current = self._out(rt, old)
            if subresource == "status":
                config = {
                    k: v
                    for k, v in config.items()
                    if k in ("apiVersion", "kind", "metadata", "status")
                }
            applied_set = P.field_set(config, keys)
            entries = current["metadata"].get("managedFields") or []
            mine = next(
                (
                    e
                    for e in entries
                    if e.get("manager") == manager
                    and e.get("operation") == "Apply"
                    and e.get("subresource", "") == subresource
                ),
                None,
            )
            previous = P.from_fields_v1((mine or {}).get("fieldsV1"))
            merged = P.apply_merge(current, config, keys)
            conflicts: list[tuple[str, tuple[str, ...], dict[str, Any]]] = []
            others: set[tuple[str, ...]] = set()
            for entry in entries:
                if entry is mine:
                    continue
                theirs = P.from_fields_v1(entry.get("fieldsV1"))
                others |= theirs
                for path in sorted(applied_set & theirs):
                    before, after = P.value_at(current, path), P.value_at(merged, path)
                    # Owning a keyed list item (".") is owning its presence, not its contents.
                    differs = before[0] != after[0] if path[-1] == "." else before != after
                    if differs:
                        conflicts.append((entry.get("manager", ""), path, entry))
            if conflicts and not ctx.force:
                raise _apply_conflict(conflicts)
            for path in previous - applied_set - others:
                P.remove_at(merged, path)
            merged["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"]
            if ctx.force:
                lost = {c[1] for c in conflicts}
                for entry in entries:
                    if entry is not mine:
                        entry["fieldsV1"] = P.to_fields_v1(
                            P.from_fields_v1(entry.get("fieldsV1")) - lost
                        )
                merged["metadata"]["managedFields"] = [
                    e for e in entries if e is mine or e.get("fieldsV1")
                ]
            else:
                merged["metadata"]["managedFields"] = entries
            return self._replace(rt, old, merged, ctx, subresource, "Apply", config)

    def delete(
        self,
        rt: ResourceType,
        ns: str,
        name: str,
        propagation: str | None = None,
        dry_run: bool = False,
        preconditions: dict[str, Any] | None = None,
    ) -> tuple[int, dict[str, Any]]:
        """DELETE: finalizers hold the object with a deletionTimestamp; else it goes at once."""
        with self.lock:
            old = self.store.get(rt.key, ns if rt.namespaced else "", name)
            if old is None:
                raise E.not_found(rt.plural, rt.group, name)
            pre = preconditions or {}
            if pre.get("uid") and pre["uid"] != old["metadata"]["uid"]:
                raise E.conflict(
                    rt.plural,
                    rt.group,
                    name,
                    f"Precondition failed: UID in precondition: {pre['uid']}, UID in object meta: "
                    f"{old['metadata']['uid']}",
                )
            if (
                pre.get("resourceVersion")
                and pre["resourceVersion"] != old["metadata"]["resourceVersion"]
            ):
                raise E.conflict(
                    rt.plural,
                    rt.group,
                    name,
                    "Precondition failed: ResourceVersion in precondition: "
                    f"{pre['resourceVersion']}, ResourceVersion in object meta: "
                    f"{old['metadata']['resourceVersion']}",
                )
            if dry_run:
                return 200, self._out(rt, old)
            obj = copy.deepcopy(old)
            meta = obj["metadata"]
            finalizers = list(meta.get("finalizers") or [])
            if rt.plural == "namespaces":
                if meta.get("deletionTimestamp"):
                    # As the namespace registry answers while its content is being removed.
                    raise E.conflict(
                        rt.plural,
                        rt.group,
                        name,
                        "The system is ensuring all content is removed from this namespace.  "
                        "Upon completion, this namespace will automatically be purged by the "
                        "system.",
                    )
                meta["deletionTimestamp"] = now_iso()
                meta["deletionGracePeriodSeconds"] = 0
                obj.setdefault("status", {})["phase"] = "Terminating"
                self._commit(rt, obj, old)
                return 200, self._out(rt, obj)
            if meta.get("deletionTimestamp"):
                return 200, self._out(rt, old)
            if propagation == "Foreground" and self._dependents(old["metadata"]["uid"]):
                finalizers.append("foregroundDeletion")
            elif propagation == "Orphan":
                self._orphan_dependents(old["metadata"]["uid"])
            if finalizers:
                meta["finalizers"] = finalizers
                meta["deletionTimestamp"] = now_iso()
                meta["deletionGracePeriodSeconds"] = 0
                if rt.has_generation:
                    meta["generation"] = meta.get("generation", 1) + 1
                self._commit(rt, obj, old)
                return 200, self._out(rt, obj)
            self._remove(rt, old)
            if rt.plural in RETURN_DELETED:
                return 200, self._out(rt, old)
            details: dict[str, Any] = {"name": name}
            if rt.group:
                details["group"] = rt.group
            details["kind"] = rt.plural
            details["uid"] = old["metadata"]["uid"]
            return 200, {
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Success",
                "details": details,
            }

    def delete_collection(
        self,
        rt: ResourceType,
        ns: str | None,
        label_selector: str | None,
        field_selector: str | None,
        propagation: str | None = None,
        dry_run: bool = False,
    ) -> dict[str, Any]:
        """DELETE on a collection: delete every matching object (none with `dry_run`, which
        still checks each delete); answers the list."""
        listed = self.list(rt, ns, label_selector, field_selector)
        for item in listed["items"]:
            meta = item["metadata"]
            try:
                self.delete(rt, meta.get("namespace", ""), meta["name"], propagation, dry_run)
            except E.ApiError:
                continue
        return listed

    # ---- write helpers ---------------------------------------------------------------------

    def _keys(self, rt: ResourceType) -> P.KeyResolver:
        return P.schema_list_keys(rt.schema) if rt.crd else P.core_list_keys

    def _check_body(self, rt: ResourceType, body: Any) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise E.bad_request(
                f'{rt.kind} in version "{rt.version}" cannot be handled as a {rt.kind}: '
                "the body must be a JSON or YAML object"
            )
        self.check_types(rt, body)
        obj = copy.deepcopy(body)
        if not rt.crd:
            # Built-in kinds take their kind and version from the URL when the body has none.
            obj.setdefault("kind", rt.kind)
            obj.setdefault("apiVersion", rt.group_version)
        kind, api_version = obj.get("kind"), obj.get("apiVersion")
        if not kind:
            raise E.bad_request(f"Object 'Kind' is missing in '{json.dumps(body)[:200]}'")
        if not api_version:
            raise E.bad_request(f"Object 'apiVersion' is missing in '{json.dumps(body)[:200]}'")
        if api_version != rt.group_version or kind != rt.kind:
            raise E.bad_request(
                f"the API version in the data ({api_version}) does not match the expected API "
                f"version ({rt.group_version})"
                if api_version != rt.group_version
                else f'{kind} in version "{rt.version}" cannot be handled as a {rt.kind}: '
                f"the kind in the data ({kind}) does not match the expected kind ({rt.kind})"
            )
        obj["apiVersion"] = rt.group_version
        return obj

    def _generate_name(self, rt: ResourceType, ns: str, prefix: str) -> str:
        alphabet = "bcdfghjklmnpqrstvwxz2456789"
        for _ in range(100):
            name = prefix[:58] + "".join(secrets.choice(alphabet) for _ in range(5))
            if self.store.get(rt.key, ns if rt.namespaced else "", name) is None:
                return name
        return prefix + uuid.uuid4().hex[:5]

    def check_types(self, rt: ResourceType, obj: Any) -> None:
        """Refuse what a typed decoder would: metadata, and every field of a built-in kind.

        The real server decodes into Go structs, so a label that is a number or a spec that is
        a list fails there with 400 BadRequest before any validation (`builtin_schema` knows
        the built-in kinds' fields; a custom resource's schema answers 422 instead).
        """

        def refuse(error: str) -> E.ApiError:
            return E.bad_request(
                f'{rt.kind} in version "{rt.version}" cannot be handled as a {rt.kind}: {error}'
            )

        def fail(where: str, want: str, value: Any) -> E.ApiError:
            what = builtin_schema.json_type(value)
            return refuse(
                f"json: cannot unmarshal {what} into Go struct field {where} of type {want}"
            )

        if not isinstance(obj, dict):
            raise fail(rt.kind, "object", obj)
        meta = obj.get("metadata", {})
        if not isinstance(meta, dict):
            raise fail("ObjectMeta.metadata", "v1.ObjectMeta", meta)
        for key in ("name", "generateName", "namespace", "resourceVersion", "uid"):
            if key in meta and meta[key] is not None and not isinstance(meta[key], str):
                raise fail(f"ObjectMeta.metadata.{key}", "string", meta[key])
        for key in ("labels", "annotations"):
            value = meta.get(key)
            if value is not None and not (
                isinstance(value, dict) and all(isinstance(v, str) for v in value.values())
            ):
                raise fail(f"ObjectMeta.metadata.{key}", "map[string]string", value)
        finalizers = meta.get("finalizers")
        if finalizers is not None and not (
            isinstance(finalizers, list) and all(isinstance(f, str) for f in finalizers)
        ):
            raise fail("ObjectMeta.metadata.finalizers", "[]string", finalizers)
        refs = meta.get("ownerReferences")
        if refs is not None:
            if not isinstance(refs, list) or not all(isinstance(r, dict) for r in refs):
                raise fail("ObjectMeta.metadata.ownerReferences", "[]v1.OwnerReference", refs)
            for ref in refs:
                for key in ("apiVersion", "kind", "name", "uid"):
                    if not isinstance(ref.get(key), str):
                        raise fail(
                            f"OwnerReference.metadata.ownerReferences.{key}", "string", ref.get(key)
                        )
        if rt.crd:
            return  # the CRD schema checks the rest, answering 422
        if error := builtin_schema.decode_error(rt, obj):
            raise refuse(error)

    def _validate_meta(self, rt: ResourceType, obj: dict[str, Any], name: str) -> None:
        errs: list[E.FieldError] = []
        if not name:
            errs.append(E.required("metadata.name", "name or generateName is required"))
        elif rt.plural in ("namespaces",):
            if len(name) > 63:
                errs.append(E.invalid("metadata.name", name, "must be no more than 63 characters"))
            if not _DNS1123_LABEL.match(name):
                errs.append(E.invalid("metadata.name", name, LABEL_MSG))
        elif rt.plural == "services":
            if len(name) > 63:
                errs.append(E.invalid("metadata.name", name, "must be no more than 63 characters"))
            if not _DNS1035_LABEL.match(name):
                errs.append(E.invalid("metadata.name", name, DNS1035_MSG))
        elif rt.plural not in ("roles", "rolebindings", "clusterroles", "clusterrolebindings"):
            if len(name) > 253:
                errs.append(E.invalid("metadata.name", name, "must be no more than 253 characters"))
            if not _DNS1123_SUBDOMAIN.match(name):
                errs.append(E.invalid("metadata.name", name, SUBDOMAIN_MSG))
        errs += _labels_and_annotations_problems(obj["metadata"])
        if errs:
            raise E.invalid_object(rt.kind, rt.group, name, errs)

    def _check_namespace(self, rt: ResourceType, ns: str, name: str) -> None:
        ns_type = self.types[("", "v1", "namespaces")]
        nso = self.store.get(ns_type.key, "", ns)
        if nso is None:
            raise E.not_found("namespaces", "", ns)
        if nso["metadata"].get("deletionTimestamp"):
            raise E.forbidden(rt.plural, rt.group, name, TERMINATING.format(ns=ns))

    def _prepare(
        self,
        rt: ResourceType,
        obj: dict[str, Any],
        old: dict[str, Any] | None,
        ctx: Ctx,
        *,
        admitted: bool = True,
    ) -> None:
        """Kind-specific defaulting and validation before storing; `admitted`: an operator's
        webhooks see the write (they are registered for the resource, so a write to its status
        or scale subresource never reaches them)."""
        name = obj["metadata"].get("name", "")
        problems = [f'duplicate field "{d}"' for d in ctx.duplicates]
        unknown = S.prune(obj, rt.schema) if rt.crd else builtin_schema.prune(rt, obj)
        problems += [f'unknown field "{u}"' for u in unknown]
        if problems and ctx.field_validation == "Strict":
            raise E.bad_request(
                f'{rt.kind} in version "{rt.version}" cannot be handled as a {rt.kind}: '
                f"strict decoding error: {', '.join(problems)}"
            )
        if problems and ctx.field_validation == "Warn":
            ctx.warnings.extend(problems)
        if rt.crd:
            S.apply_defaults(obj, rt.schema)
            if admitted and rt.key in self.defaulters:
                self.defaulters[rt.key](obj)
            errs = S.validate(obj, rt.schema, old)
            if errs:
                raise E.invalid_object(rt.kind, rt.group, name, errs)
            if admitted and rt.key in self.validators:
                webhook, validate = self.validators[rt.key]
                if errs := validate(obj, old):
                    raise E.webhook_denied(webhook, E.invalid_object(rt.kind, rt.group, name, errs))
        elif rt.plural == "secrets":
            _prepare_secret(rt, obj)
            if errs := _immutable_data_problems(obj, old, ("data",)):
                raise E.invalid_object(rt.kind, rt.group, name, errs)
        elif rt.plural == "configmaps":
            # Its fields' types were checked as the body was decoded (`check_types`).
            if errs := _immutable_data_problems(obj, old, ("data", "binaryData")):
                raise E.invalid_object(rt.kind, rt.group, name, errs)
        elif rt.plural == "namespaces":
            obj.setdefault("spec", {}).setdefault("finalizers", ["kubernetes"])
            obj.setdefault("status", {}).setdefault("phase", "Active")
            obj["metadata"].setdefault("labels", {})["kubernetes.io/metadata.name"] = name
        elif rt.plural == "services":
            spec = obj.setdefault("spec", {})
            spec.setdefault("type", "ClusterIP")
            spec.setdefault("sessionAffinity", "None")
            if problem := _service_addresses(spec, (old or {}).get("spec") or {}):
                raise E.invalid_object(rt.kind, rt.group, name, [problem])
            for port in spec.get("ports") or []:
                if isinstance(port, dict):
                    port.setdefault("protocol", "TCP")
                    if "port" in port:
                        port.setdefault("targetPort", port["port"])
            obj.setdefault("status", {"loadBalancer": {}})
        elif rt.plural == "persistentvolumeclaims":
            obj.setdefault("status", {}).setdefault("phase", "Pending")
            obj.setdefault("spec", {}).setdefault("volumeMode", "Filesystem")
            errs = workloads.validate_pvc_update(obj, old) if old is not None else []
            if errs:
                raise E.invalid_object(rt.kind, rt.group, name, errs)
        elif rt.plural == "statefulsets":
            errs = workloads.prepare_statefulset(obj, old)
            if errs:
                raise E.invalid_object(rt.kind, rt.group, name, errs)
        elif rt.plural == "pods":
            obj.setdefault("status", {}).setdefault("phase", "Pending")
        elif rt.plural == "customresourcedefinitions":
            _validate_crd(obj)

    def _set_managed(
        self,
        rt: ResourceType,
        obj: dict[str, Any],
        old: dict[str, Any] | None,
        ctx: Ctx,
        operation: str,
        subresource: str | None,
        applied: dict[str, Any] | None = None,
    ) -> None:
        """Record field ownership in metadata.managedFields, as server-side apply does."""
        keys = self._keys(rt)
        meta = obj["metadata"]
        entries = [e for e in (meta.get("managedFields") or []) if isinstance(e, dict)]
        manager = ctx.manager()
        if operation == "Apply":
            owned = P.field_set(applied or {}, keys)
        else:
            before = P.field_set(old, keys) if old else set()
            after = P.field_set(obj, keys)
            changed = {p for p in after if old is None or P.value_at(old, p) != P.value_at(obj, p)}
            removed = before - after
            if not changed and not removed:
                meta["managedFields"] = entries
                if not entries:
                    meta.pop("managedFields", None)
                return
            for entry in entries:
                theirs = P.from_fields_v1(entry.get("fieldsV1"))
                entry["fieldsV1"] = P.to_fields_v1(theirs - changed - removed)
            mine = next(
                (
                    e
                    for e in entries
                    if e.get("manager") == manager
                    and e.get("operation") == "Update"
                    and e.get("subresource") == subresource
                ),
                None,
            )
            owned = changed | (P.from_fields_v1(mine.get("fieldsV1")) if mine else set())
        entries = [
            e
            for e in entries
            if not (
                e.get("manager") == manager
                and e.get("operation") == operation
                and e.get("subresource") == subresource
            )
        ]
        entry: dict[str, Any] = {
            "manager": manager,
            "operation": operation,
            "apiVersion": rt.group_version,
            "time": now_iso(),
            "fieldsType": "FieldsV1",
            "fieldsV1": P.to_fields_v1(owned),
        }
        if subresource:
            entry["subresource"] = subresource
        entries.append(entry)
        meta["managedFields"] = [e for e in entries if e.get("fieldsV1") or e is entry]

    def _commit(self, rt: ResourceType, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        """Store a write; an object being deleted goes once its last finalizer is gone."""
        meta = obj["metadata"]
        self.store.write(rt.key, obj, "ADDED" if old is None else "MODIFIED")
        if rt.plural == "customresourcedefinitions":
            self.sync_crd(obj)
        # A namespace also waits for its spec.finalizers (the namespace controller's).
        held = rt.plural == "namespaces" and (obj.get("spec") or {}).get("finalizers")
        self.quotas.observe(rt.key, obj, old)
        if meta.get("deletionTimestamp") and not meta.get("finalizers") and not held:
            self._remove(rt, obj)

    def _remove(self, rt: ResourceType, obj: dict[str, Any]) -> None:
        gone = copy.deepcopy(obj)
        self.store.write(rt.key, gone, "DELETED")
        if rt.key == ("", "pods"):
            self.logs.drop(gone["metadata"].get("namespace", ""), gone["metadata"]["name"])
        if rt.plural == "customresourcedefinitions":
            self.sync_crd(gone, removed=True)
        self.quotas.observe(rt.key, None, gone)

    def type_of_key(self, key: tuple[str, str]) -> ResourceType | None:
        """Any served version of a stored resource."""
        for rt in self.types.values():
            if rt.key == key:
                return rt
        return None

    def _dependents(self, uid: str) -> list[tuple[ResourceType, dict[str, Any]]]:
        out = []
        for key, obj in self.gc_index.dependents_of(uid):
            rt = self.type_of_key(key)
            if rt is not None:
                out.append((rt, obj))
        return out

    def _orphan_dependents(self, uid: str) -> None:
        for rt, dep in self._dependents(uid):
            new = copy.deepcopy(dep)
            refs = [r for r in new["metadata"].get("ownerReferences") or [] if r.get("uid") != uid]
            if refs:
                new["metadata"]["ownerReferences"] = refs
            else:
                new["metadata"].pop("ownerReferences", None)
            self._commit(rt, new, dep)

    # ---- system controllers: garbage collector and namespace lifecycle ---------------------

    def collect_garbage(self) -> bool:
        """One pass of the garbage collector and namespace controller; True if it wrote.

        It looks only at what changed since the previous pass (see garbage.GcIndex).
        """
        changed = False
        with self.lock:
            index = self.gc_index
            for key, obj in index.take_unchecked():
                meta = obj["metadata"]
                refs = meta.get("ownerReferences") or []
                rt = self.type_of_key(key)
                if rt is None or not refs or meta.get("deletionTimestamp"):
                    continue
                if not any(self._owner_alive(r, meta) for r in refs):
                    self._delete_quiet(rt, meta)
                    changed = True
            for key, okey in sorted(index.foreground):
                rt = self.type_of_key(key)
                obj = self.store.get(key, *okey)
                if rt is not None and obj is not None:
                    changed |= self._delete_foreground(rt, obj)
            changed |= self._finalize_namespaces()
            changed |= self._expire_events()
        return changed

    def _delete_foreground(self, rt: ResourceType, obj: dict[str, Any]) -> bool:
        """Delete an owner's dependents, then let it go once none blocks it; True if it wrote."""
        changed = False
        meta = obj["metadata"]
        uid = meta["uid"]
        for drt, dep in self._dependents(uid):
            if not dep["metadata"].get("deletionTimestamp"):
                self._delete_quiet(drt, dep["metadata"], "Foreground")
                changed = True
        blocking = [
            d
            for _, d in self._dependents(uid)
            if any(
                r.get("uid") == uid and r.get("blockOwnerDeletion")
                for r in d["metadata"].get("ownerReferences") or []
            )
        ]
        if not blocking:
            current = self.store.get(rt.key, meta.get("namespace", ""), meta["name"])
            if current is not None:
                new = copy.deepcopy(current)
                new["metadata"]["finalizers"] = [
                    f for f in new["metadata"]["finalizers"] if f != "foregroundDeletion"
                ]
                self._commit(rt, new, current)
                changed = True
        return changed

    def _expire_events(self) -> bool:
        """Drop Events not seen for an hour, like kube-apiserver's --event-ttl."""
        rt = self.builtin("events")
        cutoff = (dt.datetime.now(dt.UTC) - dt.timedelta(seconds=EVENT_TTL_SECONDS)).strftime(
            "%Y-%m-%dT%H:%M:%SZ"
        )
        old = self.gc_index.expired_events(cutoff)
        for ns, name in old:
            self._delete_quiet(rt, {"namespace": ns, "name": name})
        return bool(old)

    def _owner_alive(self, ref: dict[str, Any], meta: dict[str, Any]) -> bool:
        found = self.gc_index.uids.get(ref.get("uid", ""))
        if found is None:
            return False
        owner_rt = self.type_of_key(found[0])
        # No cross-namespace owners: a namespaced owner must live in the dependent's namespace.
        if owner_rt is None:
            return False
        return not owner_rt.namespaced or found[1][0] == meta.get("namespace")

    def _delete_quiet(
        self, rt: ResourceType, meta: dict[str, Any], policy: str | None = None
    ) -> None:
        with contextlib.suppress(E.ApiError):
            self.delete(rt, meta.get("namespace", ""), meta["name"], policy)

    def _finalize_namespaces(self) -> bool:
        """Empty terminating namespaces, then remove those with nothing left in them."""
        changed = False
        ns_rt = self.builtin("namespaces")
        for name in sorted(self.gc_index.terminating):
            nso = self.store.get(ns_rt.key, "", name)
            if nso is None or not nso["metadata"].get("deletionTimestamp"):
                continue
            for rt, obj in self._namespace_contents(name):
                if not obj["metadata"].get("deletionTimestamp"):
                    self._delete_quiet(rt, obj["metadata"])
                    changed = True
            if self._namespace_contents(name):
                continue  # objects held by finalizers keep the namespace Terminating
            gone = copy.deepcopy(nso)
            gone["spec"]["finalizers"] = []
            self.store.write(ns_rt.key, gone, "MODIFIED")
            self._remove(ns_rt, gone)
            changed = True
        return changed

    def _namespace_contents(self, name: str) -> list[tuple[ResourceType, dict[str, Any]]]:
        """The objects of served namespaced types in a namespace, type by type in the order
        the store first held them, then by name (found through the collector's index)."""
        types: dict[tuple[str, str], ResourceType | None] = {}
        found = []
        for key, obj in self.gc_index.objects_in(name):
            if key not in types:
                types[key] = self.type_of_key(key)
            rt = types[key]
            if rt is not None and rt.namespaced:
                found.append((rt, obj))
        order = {key: i for i, key in enumerate(self.store.objects)}
        found.sort(key=lambda entry: order[entry[0].key])  # stable: names stay sorted
        return found

    # ---- watch -----------------------------------------------------------------------------

    def watch(
        self,
        rt: ResourceType,
        ns: str | None,
        resource_version: str | None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        timeout: float | None = None,
        bookmarks: bool = False,
        should_stop: Any = None,
        send_initial: bool = False,
    ) -> Iterator[WatchEvent]:
        """Start a watch: synthetic ADDED for rv unset/"0", else changes after rv.

        With send_initial (a streaming list, as kubectl 1.37 asks), the current objects come
        first whatever the version, then a BOOKMARK marking the end of the initial events.
        Bad selectors and versions raise here; the returned iterator only waits for events,
        so a caller can answer the request before the first one comes.
        """
        labels = parse_label_selector(label_selector)
        fields = parse_field_selector(field_selector, rt.plural, rt.kind)

        def match(obj: dict[str, Any] | None) -> bool:
            if obj is None:
                return False
            if ns is not None and obj["metadata"].get("namespace", "") != ns:
                return False
            return labels(obj["metadata"].get("labels") or {}) and fields(obj)

        deadline = time.monotonic() + (timeout if timeout is not None else 1800)
        with self.lock:
            if send_initial or resource_version in (None, "", "0"):
                last = self.store.rv
                initial = [o for o in self.store.items(rt.key, ns) if match(o)]
            else:
                try:
                    last = int(resource_version)
                except ValueError:
                    raise E.bad_request(f'invalid resource version "{resource_version}"') from None
                initial = []
        return self._watch_events(
            rt, match, last, initial, deadline, bookmarks, should_stop, send_initial
        )

    def _watch_events(
        self,
        rt: ResourceType,
        match: Callable[[dict[str, Any] | None], bool],
        last: int,
        initial: list[dict[str, Any]],
        deadline: float,
        bookmarks: bool,
        should_stop: Any,
        send_initial: bool,
    ) -> Iterator[WatchEvent]:
        for obj in initial:
            yield WatchEvent("ADDED", self._view(rt, obj))
        if send_initial:
            yield WatchEvent(
                "BOOKMARK",
                {
                    "kind": rt.kind,
                    "apiVersion": rt.group_version,
                    "metadata": {
                        "resourceVersion": str(last),
                        "annotations": {"k8s.io/initial-events-end": "true"},
                    },
                },
            )
        idle_since = time.monotonic()
        while True:
            if self.closing or (should_stop and should_stop()):
                return
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            events: list[Event] = []
            with self.lock:
                gone = self._expired(last)
                if gone is None:
                    events = self.store.events_after(last)
                    if not events:
                        self.store.changed_of(rt.key).wait(min(remaining, 0.5))
                        events = self.store.events_after(last)
                    gone = self._expired(last)
                head_rv = self.store.rv
            if gone is not None:
                yield WatchEvent("ERROR", gone)
                return
            out = []
            for event in events:
                last = event.rv
                if event.key != rt.key:
                    continue
                new_match, old_match = match(event.obj), match(event.old)
                if event.type == "DELETED":
                    etype = "DELETED" if new_match else ""
                elif new_match and (old_match or event.type == "ADDED"):
                    etype = event.type
                elif new_match:
                    etype = "ADDED"
                elif old_match:
                    etype = "DELETED"
                else:
                    etype = ""
                if etype:
                    out.append(WatchEvent(etype, self._view(rt, event.obj)))
            yield from out
            if out:
                idle_since = time.monotonic()
            elif bookmarks and time.monotonic() - idle_since >= self.bookmark_seconds:
                idle_since = time.monotonic()
                yield WatchEvent(
                    "BOOKMARK",
                    {
                        "kind": rt.kind,
                        "apiVersion": rt.group_version,
                        "metadata": {"resourceVersion": str(max(last, head_rv))},
                    },
                )

    def _expired(self, rv: int) -> dict[str, Any] | None:
        """The 410 Expired status for a watch at rv whose next events were compacted away."""
        if rv < self.store.compacted_rv:
            return _too_old(rv, self.store.compacted_rv + 1)
        return None

    # ---- scale subresource -----------------------------------------------------------------

    def get_scale(self, rt: ResourceType, ns: str, name: str) -> dict[str, Any]:
        """The autoscaling/v1 Scale view of an object with a scale subresource."""
        obj = self.get(rt, ns, name)
        scale = rt.scale or {}
        meta = obj["metadata"]
        selector = _jsonpath_get(obj, scale.get("labelSelectorPath", "")) or ""
        if isinstance(selector, dict):
            selector = label_selector_string(selector)
        return {
            "kind": "Scale",
            "apiVersion": "autoscaling/v1",
            "metadata": {
                k: meta[k]
                for k in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp")
                if k in meta
            },
            "spec": {"replicas": _jsonpath_get(obj, scale.get("specReplicasPath", "")) or 0},
            "status": {
                "replicas": _jsonpath_get(obj, scale.get("statusReplicasPath", "")) or 0,
                "selector": selector,
            },
        }

    def set_scale(
        self, rt: ResourceType, ns: str, name: str, replicas: Any, rv: str | None, ctx: Ctx
    ) -> dict[str, Any]:
        """Write spec replicas through the scale subresource."""
        if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 0:
            raise E.invalid_object(
                "Scale",
                "autoscaling",
                name,
                [E.invalid("spec.replicas", replicas, "must be greater than or equal to 0")],
            )
        with self.lock:
            obj = self.get(rt, ns, name)
            if rv and rv != obj["metadata"]["resourceVersion"]:
                raise E.stale(rt.plural, rt.group, name)
            path = (rt.scale or {}).get("specReplicasPath", ".spec.replicas").lstrip(".").split(".")
            cur = obj
            for part in path[:-1]:
                cur = cur.setdefault(part, {})
            cur[path[-1]] = replicas
            old = self.store.get(rt.key, ns, name)
            if old is None:
                raise E.not_found(rt.plural, rt.group, name)
            self._replace(rt, old, obj, ctx, "", "Update")
        return self.get_scale(rt, ns, name)


def _apply_conflict(conflicts: list[tuple[str, tuple[str, ...], dict[str, Any]]]) -> E.ApiError:
    def who(entry: dict[str, Any]) -> str:
        text = json.dumps(entry.get("manager", ""))
        if entry.get("subresource"):
            text += f" with subresource {json.dumps(entry['subresource'])}"
        if entry.get("operation") == "Update":
            text += f" using {entry.get('apiVersion')}"
            if entry.get("time"):
                text += f" at {entry['time']}"
        return text

    causes = [
        {
            "reason": "FieldManagerConflict",
            "message": f"conflict with {who(e)}",
            "field": P.path_string(p),
        }
        for _, p, e in conflicts
    ]
    if len(conflicts) == 1:
        _, path, entry = conflicts[0]
        message = f"Apply failed with 1 conflict: conflict with {who(entry)}: {P.path_string(path)}"
    else:
        by_manager: dict[str, list[str]] = {}
        labels: dict[str, str] = {}
        for manager, path, entry in conflicts:
            by_manager.setdefault(manager, []).append(P.path_string(path))
            labels[manager] = who(entry)
        lines = []
        for manager in sorted(by_manager):
            lines.append(f"conflicts with {labels[manager]}:")
            lines.extend(f"- {p}" for p in by_manager[manager])
        message = f"Apply failed with {len(conflicts)} conflicts: " + "\n".join(lines)
    return E.ApiError(409, "Conflict", message, {"causes": causes})


def _spec_part(obj: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in obj.items() if k not in ("metadata", "status", "apiVersion", "kind")}


def _strip_times(obj: dict[str, Any]) -> dict[str, Any]:
    out = dict(obj)
    meta = dict(out.get("metadata") or {})
    meta["managedFields"] = [
        {k: v for k, v in e.items() if k != "time"} for e in meta.get("managedFields") or []
    ]
    out["metadata"] = meta
    out.pop("apiVersion", None)
    return out


def _too_old(requested: int, oldest: int) -> dict[str, Any]:
    return E.gone(f"too old resource version: {requested} ({oldest})").status()


_LATEST = -1  # a continue token's resourceVersion for "the current state", as etcd3's store


def _encode_continue(rv: int, last: tuple[str, str]) -> str:
    raw = json.dumps({"v": "meta.k8s.io/v1", "rv": rv, "start": f"{last[0]}/{last[1]}\x00"})
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def _decode_continue(token: str) -> tuple[int, tuple[str, str]]:
    try:
        raw = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
        ns, _, name = raw["start"].rstrip("\x00").partition("/")
        return int(raw["rv"]), (ns, name)
    except (ValueError, KeyError, TypeError, binascii.Error):
        raise E.bad_request(
            "continue key is not valid: incorrect encoded start resourceVersion "
            "(version meta.k8s.io/v1)"
        ) from None


_LABEL_VALUE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
LABEL_VALUE_MSG = (
    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or "
    "'.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or "
    "'my_value',  or '12345', regex used for validation is "
    "'(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')"
)
_QUALIFIED_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
QUALIFIED_NAME_MSG = (
    "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an "
    "alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for "
    "validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"
)
ANNOTATIONS_MAX = 256 * 1024  # bytes of keys and values together


def _qualified_name_problems(key: str) -> list[str]:
    """What apimachinery's IsQualifiedName says of a label or annotation key: a name part of
    at most 63 characters, with an optional DNS subdomain prefix and "/"."""
    parts = key.split("/")
    if len(parts) > 2:
        return [
            f"a qualified name {QUALIFIED_NAME_MSG} with an optional DNS subdomain prefix and '/' "
            "(e.g. 'example.com/MyName')"
        ]
    problems = []
    if len(parts) == 2:
        prefix = parts[0]
        if not prefix:
            problems.append("prefix part must be non-empty")
        elif len(prefix) > 253 or not _DNS1123_SUBDOMAIN.match(prefix):
            problems.append(f"prefix part {SUBDOMAIN_MSG}")
    name = parts[-1]
    if not name:
        problems.append("name part must be non-empty")
    elif len(name) > 63:
        problems.append("name part must be no more than 63 characters")
    elif not _QUALIFIED_NAME.match(name):
        problems.append(f"name part {QUALIFIED_NAME_MSG}")
    return problems


def _labels_and_annotations_problems(meta: dict[str, Any]) -> list[E.FieldError]:
    """ValidateObjectMeta's checks of labels (keys and values) and annotations (keys, and their
    total size), as kube-apiserver runs them on every create and update."""
    errs = []
    for key, value in (meta.get("labels") or {}).items():
        errs += [E.invalid("metadata.labels", key, p) for p in _qualified_name_problems(key)]
        if len(value) > 63:
            errs.append(E.invalid("metadata.labels", value, "must be no more than 63 characters"))
        elif value and not _LABEL_VALUE.match(value):
            errs.append(E.invalid("metadata.labels", value, LABEL_VALUE_MSG))
    annotations = meta.get("annotations") or {}
    for key in annotations:
        errs += [
            E.invalid("metadata.annotations", key, p) for p in _qualified_name_problems(key.lower())
        ]
    size = sum(len(k.encode()) + len(v.encode()) for k, v in annotations.items())  # bytes
    if size > ANNOTATIONS_MAX:
        errs.append(
            E.FieldError(
                "FieldValueTooLong",
                "metadata.annotations",
                detail=f"may not be more than {ANNOTATIONS_MAX} bytes",
            )
        )
    return errs


def _service_addresses(spec: dict[str, Any], before: dict[str, Any]) -> E.FieldError | None:
    """A Service's clusterIP as kube-apiserver's Service storage keeps it (`before`: the stored
    spec, {} on create): allocated when missing or "" (headless with "None"); written again
    without it, or with "", the one allocated stays (a manifest applied again); once set it may
    not change; a type that needs none (ExternalName) drops it. The problem, if any."""
    was = before.get("clusterIP") if before.get("type", "ClusterIP") != "ExternalName" else None
    if spec["type"] == "ExternalName":
        if spec.get("clusterIP") in (None, "", was):
            spec.pop("clusterIP", None)
            spec.pop("clusterIPs", None)
        return None
    if was and spec.get("clusterIP") in (None, ""):
        spec["clusterIP"] = was
        if not any(spec.get("clusterIPs") or []):
            spec["clusterIPs"] = copy.deepcopy(before.get("clusterIPs") or [was])
    elif was and spec["clusterIP"] != was:
        # Allocated once: a Service cannot become headless, nor the other way.
        value = E.RawValue(f'[]string{{"{spec["clusterIP"]}"}}')
        return E.invalid("spec.clusterIPs[0]", value, "may not change once set")
    if not spec.get("clusterIP"):
        spec["clusterIP"] = _cluster_ip()
    if spec["clusterIP"] != "None" and not any(spec.get("clusterIPs") or []):
        spec["clusterIPs"] = [spec["clusterIP"]]
    return None


def _immutable_data_problems(
    obj: dict[str, Any], old: dict[str, Any] | None, fields: tuple[str, ...]
) -> list[E.FieldError]:
    """ValidateSecretUpdate's and ValidateConfigMapUpdate's: once `immutable: true`, neither
    its content nor the flag changes (a Secret's type never does)."""
    if old is None:
        return []
    errs = []
    if old.get("kind") == "Secret" and obj.get("type") != old.get("type", "Opaque"):
        errs.append(E.invalid("type", obj.get("type"), "field is immutable"))
    if old.get("immutable") is True:
        gone = "field is immutable when `immutable` is set"
        if obj.get("immutable") is not True:
            errs.append(E.forbidden_field("immutable", gone))
        for field_name in fields:
            if (obj.get(field_name) or {}) != (old.get(field_name) or {}):
                errs.append(E.forbidden_field(field_name, gone))
    return errs


def _prepare_secret(rt: ResourceType, obj: dict[str, Any]) -> None:
    """`stringData` folded into `data`, whose values must be base64 (their types were checked
    as the body was decoded: `check_types`)."""
    data = dict(obj.get("data") or {})
    for value in data.values():
        try:
            base64.b64decode(str(value), validate=True)
        except (binascii.Error, ValueError):
            raise E.bad_request(
                'Secret in version "v1" cannot be handled as a Secret: illegal base64 data at '
                "input byte 0"
            ) from None
    string_data = obj.pop("stringData", None)
    if isinstance(string_data, dict):
        for key, value in string_data.items():
            data[key] = base64.b64encode(str(value).encode()).decode()
    if data or "data" in obj:
        obj["data"] = data
    obj.setdefault("type", "Opaque")


def _validate_crd(obj: dict[str, Any]) -> None:
    spec = obj.get("spec") or {}
    names = spec.get("names") or {}
    name = obj["metadata"].get("name", "")
    errs = []
    expected = f"{names.get('plural', '')}.{spec.get('group', '')}"
    if name != expected:
        errs.append(E.invalid("metadata.name", name, 'must be spec.names.plural+"."+spec.group'))
    if not spec.get("versions"):
        errs.append(
            E.required("spec.versions", "must have exactly one version marked as storage version")
        )
    if errs:
        raise E.invalid_object("CustomResourceDefinition", "apiextensions.k8s.io", name, errs)
    obj.setdefault("status", {})
    obj["status"]["acceptedNames"] = names
    obj["status"]["storedVersions"] = [v["name"] for v in spec["versions"] if v.get("storage")]
    obj["status"]["conditions"] = [
        {
            "type": "NamesAccepted",
            "status": "True",
            "reason": "NoConflicts",
            "message": "no conflicts found",
            "lastTransitionTime": now_iso(),
        },
        {
            "type": "Established",
            "status": "True",
            "reason": "InitialNamesAccepted",
            "message": "the initial names have been accepted",
            "lastTransitionTime": now_iso(),
        },
    ]


def _jsonpath_get(obj: dict[str, Any], path: str) -> Any:
    cur: Any = obj
    for part in path.lstrip(".").split("."):
        if not part:
            continue
        if not isinstance(cur, dict):
            return None
        cur = cur.get(part)
    return cur


def _cluster_ip() -> str:
    """A free-looking address in the default service range."""
    return f"10.96.{secrets.randbelow(256)}.{secrets.randbelow(254) + 1}"


def _name_mismatch(body_name: Any, url_name: str) -> E.ApiError:
    return E.bad_request(
        f"the name of the object ({body_name}) does not match the name on the URL ({url_name})"
    )
