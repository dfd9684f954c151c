"""The Kubernetes driver: the only module that talks to a cluster, through the official client.

One `KubeDriver` per cell, built from its kubeconfig (or the in-cluster
configuration). Every call has a timeout and never retries or sleeps; an
API failure becomes a `TransientError` (try again later: 429, 5xx, write
conflicts, lost connections) or a `PermanentError` (the request itself is
wrong), each with one readable line such as
`Backup "x" is invalid: spec.cluster.name: Required value`.
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import urllib3
import yaml
from kubernetes import client, config, dynamic, watch
from kubernetes.client import rest
from kubernetes.client.rest import ApiException
from kubernetes.dynamic.discovery import CacheEncoder, LazyDiscoverer
from kubernetes.dynamic.exceptions import DynamicApiError, ResourceNotFoundError
from kubernetes.dynamic.resource import ResourceList

from deployments.workflow.driver import DriverError, PermanentError, TransientError

FIELD_MANAGER = "opsdeck"
# (connect, read) seconds for every request, discovery's included.
TIMEOUT = (5, 30)
# One attempt per request: urllib3's default (Retry(3)) sends a request that timed out or
# lost its connection up to four times, four timeouts for a cluster that never answers.
# Trying again is the runner's, later, with backoff.
NO_RETRIES = urllib3.Retry(0)
# Seconds past a watch's own timeout that its silence ends it (`watch_objects`).
WATCH_GRACE = 10
# The most of a pod's log one read brings back, in at most so many requests (`pod_log`).
LOG_BYTES = 512 * 1024
LOG_READS = 3
# What a 401 says, to the customer whose operation waits on it as to the platform team.
UNAUTHORIZED = (
    "The cluster refused the credentials Opsdeck holds for it (401 Unauthorized): the platform "
    "team must renew them"
)
_TRANSIENT_STATUS = {408, 425, 429, 500, 502, 503, 504}
# A server-side apply of a manifest holding a field its kind lacks, or a value of the wrong type,
# answers 500 (kubernetes issue 122480), which no retry changes.
_APPLY_UNTYPED = "failed to create typed patch object"
_STRICT = [("fieldValidation", "Strict")]
_PATCH_TYPES = {
    "merge": "application/merge-patch+json",
    "strategic": "application/strategic-merge-patch+json",
    "json": "application/json-patch+json",
}


def api_client_from_kubeconfig(kubeconfig: str, *, context: str | None = None) -> client.ApiClient:
    """An ApiClient for a kubeconfig given as YAML text."""
    try:
        data = yaml.safe_load(kubeconfig)
    except yaml.YAMLError as exc:
        raise PermanentError(f"The kubeconfig is not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise PermanentError("The kubeconfig is not a kubeconfig mapping.")
    try:
        return config.new_client_from_config_dict(data, context=context or None)
    except (config.ConfigException, KeyError, TypeError, ValueError) as exc:
        raise PermanentError(f"The kubeconfig cannot be used: {exc}") from exc


def api_client_in_cluster() -> client.ApiClient:
    """An ApiClient from the service account of the pod this process runs in."""
    configuration = client.Configuration()
    try:
        config.load_incluster_config(client_configuration=configuration)
    except config.ConfigException as exc:
        raise PermanentError(f"No in-cluster configuration: {exc}") from exc
    return client.ApiClient(configuration)


def _status(exc: ApiException) -> tuple[str, str]:
    """The (message, reason) of the Status body an API error carries."""
    try:
        body = json.loads(exc.body or "{}")
    except (TypeError, ValueError):
        return str(exc.body or ""), ""
    if not isinstance(body, dict):
        return str(body), ""
    return str(body.get("message", "")), str(body.get("reason", ""))


def readable(exc: Exception) -> str:
    """One line a person can act on, from an API error or a connection failure."""
    if isinstance(exc, ApiException):
        message, _ = _status(exc)
        message = message or exc.reason or f"HTTP {exc.status}"
        # "Backup.example.io "x" is invalid" reads better as "Backup "x" is invalid".
        return re.sub(r'^(\w+)\.[a-z0-9.-]+ "', r'\1 "', message)
    if isinstance(exc, urllib3.exceptions.HTTPError | OSError):
        return _connection_failure(_cause(exc))
    return str(exc)


def _cause(exc: Exception) -> Exception:
    """What a failed request met: urllib3 wraps it in a MaxRetryError (no retries left) or,
    through a proxy, a ProxyError."""
    while True:
        if isinstance(exc, urllib3.exceptions.MaxRetryError) and exc.reason is not None:
            exc = exc.reason
        elif isinstance(exc, urllib3.exceptions.ProxyError) and exc.original_error is not None:
            exc = exc.original_error
        else:
            return exc


def _connection_failure(cause: Exception) -> str:
    """A request that got no answer, said in words (not urllib3's class names)."""
    errors = urllib3.exceptions
    if isinstance(cause, errors.NameResolutionError):
        return "The cluster could not be reached (its host name does not resolve)"
    if isinstance(cause, errors.NewConnectionError):
        # Its cause is the socket's error: "Connection refused", "No route to host"...
        why = getattr(cause.__cause__, "strerror", None) or "no connection"
        return f"The cluster could not be reached ({why[0].lower()}{why[1:]})"
    if isinstance(cause, errors.ConnectTimeoutError):
        return "The cluster could not be reached (the connection timed out)"
    if isinstance(cause, errors.ReadTimeoutError):
        return "The cluster did not answer in time"
    if isinstance(cause, errors.SSLError):
        return "The secure connection to the cluster failed (check the kubeconfig's certificates)"
    if isinstance(
        cause, errors.ProtocolError | errors.IncompleteRead | errors.InvalidChunkLength | OSError
    ):
        return "The connection to the cluster was lost"
    return "The cluster's answer could not be read"


def classify(exc: Exception) -> DriverError:
    """The driver error for any failure of a call to the cluster."""
    if isinstance(exc, DriverError):
        return exc
    if isinstance(exc, ApiException):
        message, reason = _status(exc)
        if exc.status == 401:
            # Authentication comes before anything else: nothing of the request was applied.
            # The cell's credentials expired or were revoked, which is no fault of the request:
            # it is tried again until the platform team renews them (or the run's deadline).
            return TransientError(UNAUTHORIZED, status=401, reason=reason, sent=False)
        # A 409 Conflict is a stale write worth redoing; AlreadyExists is not.
        transient = (
            exc.status in _TRANSIENT_STATUS or (exc.status == 409 and reason != "AlreadyExists")
        ) and not message.startswith(_APPLY_UNTYPED)
        kind = TransientError if transient else PermanentError
        return kind(
            readable(exc),
            status=exc.status,
            reason=reason,
            retry_after=_retry_after(exc),
            # Throttled (API Priority and Fairness, max in-flight) before it was handled.
            sent=exc.status != 429,
        )
    if isinstance(exc, urllib3.exceptions.HTTPError | OSError):
        # A connection never made (refused, timed out, a name that does not resolve) carried
        # nothing; once made, a request may have been sent whole before it failed.
        unsent = isinstance(_cause(exc), urllib3.exceptions.ConnectTimeoutError)
        return TransientError(readable(exc), sent=not unsent)
    return PermanentError(readable(exc))


def _continue_offered(error: DriverError) -> str | None:
    """The continue token a 410 Expired answer to a list with an expired one offers, if any."""
    answer = error.__cause__
    if error.status != 410 or not isinstance(answer, ApiException):
        return None
    try:
        status = json.loads(answer.body or "{}")
    except ValueError:
        return None
    metadata = status.get("metadata") if isinstance(status, dict) else None
    return metadata.get("continue") if isinstance(metadata, dict) else None


def event_seen(event: dict[str, Any]) -> datetime | None:
    """When an event was last seen, from whichever of its times the API server wrote (core/v1
    Events keep `lastTimestamp`; events.k8s.io ones a series or `eventTime`); None without."""
    series = event.get("series") or {}
    for value in (
        event.get("lastTimestamp"),
        series.get("lastObservedTime"),
        event.get("eventTime"),
        (event.get("metadata") or {}).get("creationTimestamp"),
    ):
        if isinstance(value, str) and value:
            try:
                return datetime.fromisoformat(value)
            except ValueError:
                continue
    return None


def _retry_after(exc: ApiException) -> float | None:
    """The seconds an answer's Retry-After asks to wait (API Priority and Fairness sends it
    with a 429); None without one, or with a date, which API servers do not send."""
    value = exc.headers.get("Retry-After") if exc.headers else None
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        return None
    return seconds if 0 <= seconds <= 3600 else None


# What a JSON answer that is no object is, in JSON's words.
_JSON_TYPES = {
    list: "array", str: "string", int: "number", float: "number", bool: "boolean",
    type(None): "null",
}  # fmt: skip


def _as_shown(answer: dict[str, Any]) -> dict[str, Any]:
    """An answer as `kubectl get -o json` shows it (kubectl 1.21 and later), which is what
    Argo's resource templates and a spec author see:

    - no object's `metadata.managedFields`: the field managers' bookkeeping, a third or more of a
      small object, which nothing here reads and the engine would otherwise keep with every
      object it reads back;
    - a list's items with their apiVersion and kind: an API server leaves both out of the
      items of built-in kinds (a Secret list's items are Secrets), and what reads an item
      (the watcher's listing, for one) names it by its kind."""
    kind = answer["kind"]
    if kind.endswith("List") and "items" in answer:
        answer["items"] = answer["items"] or []
        for item in answer["items"]:
            item.setdefault("apiVersion", answer.get("apiVersion"))
            item.setdefault("kind", kind.removesuffix("List"))
            _unmanaged(item)
    return _unmanaged(answer)


def _unmanaged(obj: Any) -> Any:
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    if isinstance(meta, dict):
        meta.pop("managedFields", None)
    return obj


class WatchExpired(Exception):
    """410 Gone: the version a watch resumes from is too old; list again."""


class _WholeCacheDiscoverer(LazyDiscoverer):
    """The client's discovery, safe to share between threads (a cell's watches share their
    driver), its cache file written whole.

    The library discovers again whenever a lookup finds nothing, emptying its cache in place
    while it does: another thread's lookup meanwhile failed with a `KeyError`. Lookups and
    rediscoveries here take turns. And the library truncates the cache file and writes it in
    place, so another process reading it meanwhile (the worker beside the cell watcher) found
    it empty and logged "load cache error" before discovering again."""

    def __init__(self, client, cache_file):
        self._turns = threading.RLock()  # before the library's own start, which discovers
        super().__init__(client, cache_file)

    def search(self, **kwargs):
        with self._turns:
            return super().search(**kwargs)

    def invalidate_cache(self) -> None:
        """Discover again; when the cluster answers /version or /apis with an error, the cache
        stays as it was. The library's own emptied it first and left it so, and every later
        lookup in a group it had not read yet failed with a `KeyError`."""
        with self._turns:
            kept = self._cache
            try:
                super().invalidate_cache()
            except BaseException:
                self._cache = kept  # its resources are still those the lookups search
                raise

    def _write_cache(self) -> None:
        path = self._Discoverer__cache_file  # the library's own (name-mangled) attribute
        temporary = f"{path}.{os.getpid()}.tmp"
        try:
            with open(temporary, "w") as handle:
                json.dump(self._cache, handle, cls=CacheEncoder)
            os.replace(temporary, path)
        except OSError:
            pass  # as the library: a cache that cannot be written is rebuilt next time


class _TimedRESTClient(rest.RESTClientObject):
    """The client's HTTP layer with a timeout on every request, not only on those given one:
    the client sends its discovery requests (/version, /api, /apis) with none, and against a
    cluster that takes the connection and never answers the first call waited for ever."""

    def __init__(self, configuration: client.Configuration, timeout: tuple[float, float]):
        super().__init__(configuration)
        self.timeout = timeout

    def request(self, method, url, *args, _request_timeout=None, **kwargs):
        return super().request(
            method, url, *args, _request_timeout=_request_timeout or self.timeout, **kwargs
        )


class KubeDriver:
    """The engine's driver over one cluster, with a discovery cache of its own. Every request
    it makes has `timeout` (connect, read) seconds and is sent once."""

    def __init__(
        self,
        api_client: client.ApiClient,
        *,
        cache_file: str | None = None,
        timeout: tuple[float, float] = TIMEOUT,
    ):
        # The client's connection pool is made with the configuration's retries: made again.
        api_client.configuration.retries = NO_RETRIES
        api_client.rest_client = _TimedRESTClient(api_client.configuration, timeout)
        self.api_client = api_client
        self.timeout = timeout
        self._cache_file = cache_file
        self._dynamic: dynamic.DynamicClient | None = None

    @property
    def dynamic(self) -> dynamic.DynamicClient:
        if self._dynamic is None:
            try:
                self._dynamic = dynamic.DynamicClient(
                    self.api_client, cache_file=self._cache_file, discoverer=_WholeCacheDiscoverer
                )
            except Exception as exc:  # discovery may fail in any way the API can
                raise classify(exc) from exc
        return self._dynamic

    def close(self) -> None:
        self.api_client.close()

    def _discover(self, api_version: str | None, kind: str | None):
        # Discovery talks to the API too: its failures are classified like any call's.
        try:
            return self.dynamic.resources.get(api_version=api_version, kind=kind)
        except ResourceNotFoundError:
            raise
        except (ApiException, urllib3.exceptions.HTTPError, OSError) as exc:
            raise classify(exc) from exc

    def _resource(self, obj: dict[str, Any], subresource: str | None = None):
        api_version, kind = obj.get("apiVersion"), obj.get("kind")
        try:
            # A kind missing from the cache is looked for again on the cluster, where its CRD
            # may have been installed since (the library's lookup discovers again on a miss).
            resource = self._discover(api_version, kind)
        except ResourceNotFoundError as exc:
            if api_version and self._lists(api_version, kind):
                # The library reads a group whose list of kinds it could not read (a 503, as
                # an API server short of capacity answers) as one that has none.
                raise TransientError(
                    f"The cluster's list of the kinds {api_version} serves could not be read."
                ) from exc
            raise PermanentError(
                f"The cluster does not serve {kind} in {api_version}; is its operator installed?"
            ) from exc
        if subresource:
            found = resource.subresources.get(subresource)
            if found is None:
                raise PermanentError(f"{kind} has no {subresource} subresource.")
            return found
        return resource

    def _lists(self, api_version: str, kind: str) -> bool:
        """Whether the cluster's list of the kinds `api_version` serves names `kind` (False
        when it serves no such group and version); an error it answers with is the call's."""
        path = f"/apis/{api_version}" if "/" in api_version else f"/api/{api_version}"
        try:
            listed = self._call(self.dynamic.request, "GET", path)
        except PermanentError as error:
            if error.status == 404:
                return False
            raise
        return any(r.get("kind") == kind for r in listed.get("resources") or [])

    def _call(self, fn, *args, **kwargs) -> dict[str, Any]:
        """The call's answer as plain JSON (`serialize=False`: the dynamic client's own
        wrapping of every nested field, unwrapped again here, cost more than the request).

        An API server answers every call this driver makes with an object of some kind (a
        delete's too: the object, or a Status); an answer that is none — empty, as a proxy in
        front of the cluster may give, or other JSON — is an error, not an object that is not
        there."""
        try:
            response = fn(*args, serialize=False, **kwargs)
            body = response.data
        except DynamicApiError as exc:
            raise classify(exc) from exc
        except (ApiException, urllib3.exceptions.HTTPError, OSError) as exc:
            raise classify(exc) from exc
        try:
            answer = json.loads(body) if body else None
        except ValueError as exc:
            raise PermanentError("The cluster's answer is not JSON.") from exc
        if not isinstance(answer, dict):
            said = f"it is a JSON {_JSON_TYPES[type(answer)]}" if body else "it is empty"
            raise PermanentError(f"The cluster's answer is not a Kubernetes object: {said}.")
        if not answer.get("kind") or not isinstance(answer["kind"], str):
            raise PermanentError("The cluster's answer is not a Kubernetes object: it has no kind.")
        return _as_shown(answer)

    @staticmethod
    def _where(obj: dict[str, Any]) -> tuple[str, str | None]:
        meta = obj.get("metadata") or {}
        return meta.get("name"), meta.get("namespace")

    # --- the Driver protocol ----------------------------------------------------

    def create(self, obj: dict[str, Any], *, owner_label: tuple[str, str]) -> dict[str, Any]:
        name, namespace = self._where(obj)
        resource = self._resource(obj)
        try:
            return self._call(
                resource.create, body=obj, namespace=namespace, field_manager=FIELD_MANAGER,
                query_params=list(_STRICT),
            )  # fmt: skip
        except PermanentError as exc:
            if exc.reason != "AlreadyExists":
                raise
        existing = self.get(obj)
        label, value = owner_label
        if existing is not None and (existing["metadata"].get("labels") or {}).get(label) == value:
            return existing  # created by this operation before a restart
        raise PermanentError(f'{obj["kind"]} "{name}" already exists and was made by someone else.')

    def apply(self, obj: dict[str, Any], *, field_manager: str | None = None) -> dict[str, Any]:
        name, namespace = self._where(obj)
        return self._call(
            self._resource(obj).server_side_apply,
            body=obj,
            name=name,
            namespace=namespace,
            field_manager=field_manager or FIELD_MANAGER,
            force_conflicts=True,
            query_params=list(_STRICT),
        )

    def patch(
        self, obj: dict[str, Any], *, strategy: str, subresource: str | None
    ) -> dict[str, Any]:
        name, namespace = self._where(obj)
        if strategy not in _PATCH_TYPES:
            raise PermanentError(f"Unknown patch strategy {strategy!r}.")
        body = obj.get("patch") if strategy == "json" else obj
        return self._call(
            self._resource(obj, subresource).patch,
            body=body,
            name=name,
            namespace=namespace,
            content_type=_PATCH_TYPES[strategy],
            field_manager=FIELD_MANAGER,
            query_params=list(_STRICT),
        )

    def replace(self, obj: dict[str, Any]) -> dict[str, Any]:
        name, namespace = self._where(obj)
        current = self.get(obj)
        if current is not None:  # replace needs the version it replaces
            version = current["metadata"]["resourceVersion"]
            obj = {**obj, "metadata": {**obj["metadata"], "resourceVersion": version}}
        return self._call(
            self._resource(obj).replace,
            body=obj,
            name=name,
            namespace=namespace,
            query_params=list(_STRICT),
        )

    def delete(self, obj: dict[str, Any]) -> None:
        name, namespace = self._where(obj)
        try:
            self._call(self._resource(obj).delete, name=name, namespace=namespace)
        except PermanentError as exc:
            if exc.status != 404:
                raise

    def get(self, obj: dict[str, Any]) -> dict[str, Any] | None:
        name, namespace = self._where(obj)
        try:
            return self._call(self._resource(obj).get, name=name, namespace=namespace)
        except PermanentError as exc:
            if exc.status == 404:
                return None
            raise

    def list_objects(
        self,
        api_version: str,
        kind: str,
        *,
        label_selector: str = "",
        namespace: str | None = None,
        page: int = 500,
    ) -> Iterator[dict[str, Any]]:
        """Every object of `kind` that `label_selector` selects, in `namespace` or in all of
        them, read a page at a time (one LIST per page, `continue` between them), so memory
        stays bounded.

        A page whose snapshot the cluster compacted meanwhile (410 Expired, minutes into a long
        list) goes on with the token the cluster offers in its answer: from the same place, in
        the current state. An object changed between the pages is then read as it is now, or
        missed if it moved before that place, as in any list of a cluster that changes."""
        resource = self._resource({"apiVersion": api_version, "kind": kind})
        token, offered = None, False
        while True:
            try:
                listed = self._call(
                    resource.get,
                    namespace=namespace,
                    label_selector=label_selector or None,
                    limit=page,
                    _continue=token,
                )
            except PermanentError as exc:
                # Once for a page: a token the cluster offered that expires too is an error.
                token = None if offered or not token else _continue_offered(exc)
                if token is None:
                    raise
                offered = True
                continue
            yield from listed.get("items") or []
            token, offered = (listed.get("metadata") or {}).get("continue"), False
            if not token:
                return

    def pod_log(
        self,
        namespace: str,
        pod: str,
        *,
        container: str | None = None,
        tail_lines: int | None = None,
        since_seconds: int | None = None,
        limit_bytes: int = LOG_BYTES,
    ) -> str:
        """A pod's recent log lines, each prefixed with its RFC 3339 time (`timestamps`): the
        newest whole lines within `limit_bytes` (the pod log API; never a held-open stream).

        The API's limitBytes keeps the first bytes of the lines asked for, dropping the newest:
        lines that do not fit are asked for again, as many as fitted (fewer each time, at most
        `LOG_READS` requests, each within `limit_bytes`)."""

        def cut(data: bytes, lines: int | None) -> bool:
            """Whether the answer lacks some of the lines asked for (all, without a count)."""
            if lines is None:
                return len(data) >= limit_bytes
            return data.count(b"\n") < lines and len(data) >= limit_bytes

        lines = tail_lines
        data = self._pod_log_read(namespace, pod, container, lines, since_seconds, limit_bytes)
        for _ in range(LOG_READS - 1):
            if not cut(data, lines):
                break
            fitted = data.count(b"\n")
            lines = fitted if lines is None else min(fitted, lines - 1)
            if lines < 1:
                break
            data = self._pod_log_read(namespace, pod, container, lines, since_seconds, limit_bytes)
        if cut(data, lines) and b"\n" in data:  # still cut: not its last line, partial
            data = data[: data.rindex(b"\n") + 1]
        return data.decode("utf-8", errors="replace")

    def _pod_log_read(
        self,
        namespace: str,
        pod: str,
        container: str | None,
        tail_lines: int | None,
        since_seconds: int | None,
        limit_bytes: int,
    ) -> bytes:
        try:
            # Unparsed: the client would otherwise return the repr of the bytes it read
            # (kubernetes-client/python#2596).
            response = client.CoreV1Api(self.api_client).read_namespaced_pod_log(
                pod,
                namespace,
                container=container or None,
                tail_lines=tail_lines,
                since_seconds=since_seconds,
                timestamps=True,
                limit_bytes=limit_bytes,
                _preload_content=False,
            )
            return response.data
        except (ApiException, urllib3.exceptions.HTTPError, OSError) as exc:
            raise classify(exc) from exc

    def last_warning(self, obj: dict[str, Any], *, since: float | None) -> str:
        """The newest Warning event about `obj`, last seen at `since` or later, as "Reason:
        message" ("" without one): the events of its namespace, read in one LIST (an instance's
        namespace holds few), the object's picked out (API servers differ in the field
        selectors they serve for events)."""
        meta = obj.get("metadata") or {}
        newest: tuple[float, str] | None = None
        for event in self.list_objects("v1", "Event", namespace=meta.get("namespace")):
            involved = event.get("involvedObject") or {}
            if (
                event.get("type") != "Warning"
                or involved.get("kind") != obj.get("kind")
                or involved.get("name") != meta.get("name")
            ):
                continue
            when = event_seen(event)
            seen = when.timestamp() if when else None
            # Times are to the second: one seen in the second the task began counts.
            if seen is None or (since is not None and seen < int(since)):
                continue
            said = f"{event.get('reason') or 'Warning'}: {event.get('message') or ''}".strip()
            if newest is None or seen >= newest[0]:
                newest = (seen, said.rstrip(":"))
        return newest[1] if newest else ""

    def resolve(self, resource: str) -> tuple[str, str]:
        name, _, qualifier = resource.strip().partition(".")
        wanted = name.lower()

        def matching(*, fresh: bool = False) -> list:
            try:
                if fresh:  # a CRD installed after discovery was cached
                    self.dynamic.resources.invalidate_cache()
                served = self.dynamic.resources.search()
            except ResourceNotFoundError:
                return []
            except (ApiException, urllib3.exceptions.HTTPError, OSError) as exc:
                raise classify(exc) from exc
            return [
                r
                for r in served
                if not isinstance(r, ResourceList)
                and wanted in {r.name, r.singular_name, r.kind.lower(), *(r.short_names or [])}
                and (not qualifier or qualifier in {r.group, f"{r.api_version}.{r.group}"})
            ]

        found = matching() or matching(fresh=True)
        if not found:
            raise PermanentError(f'The cluster serves no resource type "{resource}".')
        if len({r.group for r in found}) > 1 and any(r.group == "" for r in found):
            found = [r for r in found if r.group == ""]  # kubectl's priority: core first
        kinds = sorted({f"{r.kind}.{r.group}" if r.group else r.kind for r in found})
        if len(kinds) > 1:  # groups other than the core one (it was chosen above)
            raise PermanentError(
                f'"{resource}" could mean {" or ".join(kinds)}; add the group, as in '
                f'"{found[0].name}.{found[0].group}"'
            )
        chosen = next((r for r in found if getattr(r, "preferred", False)), found[0])
        return chosen.group_version, chosen.kind

    # --- watching (the cell watcher) ------------------------------------------------

    def list_for_watch(self, api_version: str, kind: str) -> tuple[list[dict[str, Any]], str]:
        """Every object of `kind` in all namespaces, and the resourceVersion to watch from."""
        resource = self._resource({"apiVersion": api_version, "kind": kind})
        listed = self._call(resource.get)
        return listed.get("items") or [], (listed.get("metadata") or {}).get("resourceVersion")

    def watch_objects(
        self, api_version: str, kind: str, *, resource_version: str, timeout: int
    ) -> Iterator[tuple[str, dict[str, Any]]]:
        """The changes to objects of `kind` in all namespaces after `resource_version`, as
        (event type, object) — BOOKMARK events too, whose object carries only the version —
        until the server ends the watch after `timeout` seconds (or nothing came for
        `WATCH_GRACE` seconds past it: a TransientError). `WatchExpired` when the version is
        too old (list again); a DriverError for any other failure."""
        resource = self._resource({"apiVersion": api_version, "kind": kind})
        try:
            # The stream the dynamic client's `watch` reads, without the object model it would
            # build of each event's object for nothing: the object is used as the JSON it was.
            for event in watch.Watch().stream(
                resource.get,
                resource_version=resource_version,
                serialize=False,
                timeout_seconds=timeout,
                allow_watch_bookmarks=True,
                # Silence past the server's own end (a connection dropped without a word, after
                # a failover) ends the watch too: else it waits on it for ever.
                _request_timeout=(self.timeout[0], timeout + WATCH_GRACE),
            ):
                yield event["type"], _unmanaged(event["raw_object"])
        except (DynamicApiError, ApiException) as exc:
            if getattr(exc, "status", None) == 410:
                raise WatchExpired(readable(exc)) from exc
            raise classify(exc) from exc
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise classify(exc) from exc

    # --- what Opsdeck itself needs ------------------------------------------------

    def serves(self, api_version: str, kind: str) -> bool:
        """Whether the cluster serves `kind` (e.g. the operator's CRDs are installed). A refusal
        the API answers with (401, 403) is raised: it says nothing of the kinds served."""
        try:
            self._resource({"apiVersion": api_version, "kind": kind})
        except PermanentError as exc:
            if exc.status is not None:
                raise
            return False
        return True
