"""`spec_test`: every workflow of a spec, run against a fresh in-process sandbox cluster.

A spec author's CI. No database and no worker: the workflow engine is driven directly, with a
`KubeDriver` on the sandbox, in the order an instance lives through its verbs (`ORDER`). A
backup's outputs become the snapshot metadata that `restore` reads, and the restore runs into a
new instance, as it would in production. `$sys` is built as the runner builds it
(`deployments.executor`, which the runner runs too), from a pretend cell (`SpecTestCell`) and
tenant.
"""

from __future__ import annotations

import contextlib
import secrets
import string
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from deployments import executor
from deployments.kube import KubeDriver, api_client_from_kubeconfig
from deployments.schedules import plan_retention_days
from deployments.spec.model import Parameter, PlanSpec, Verb
from deployments.spec.params import ParameterErrors, check, validate_parameters
from deployments.workflow import engine
from deployments.workflow.driver import DriverError, TransientError
from deployments.workflow.render import RenderError

PASSED, FAILED, SKIPPED, NOT_RUN = "passed", "failed", "skipped", "not run"
RESULTS = (PASSED, FAILED, SKIPPED, NOT_RUN)

# System verbs in the order an instance lives through them; custom verbs run after CUSTOM_AFTER.
ORDER = (
    "create",
    "modify",
    "failover",
    "addCapacity",
    "removeCapacity",
    "stop",
    "start",
    "restart",
    "applyBackupRetention",
    "backup",
    "restore",
    "deleteBackup",
    "delete",
)
CUSTOM_AFTER = "removeCapacity"

SPEED = 50.0  # the sandbox's time factor: simulated durations are divided by it
VERB_TIMEOUT = 120.0  # wall-clock seconds one verb may take before it is failed
IDLE_SLEEP = 0.05  # seconds between two advances that made no progress
TRANSIENT_SLEEP = 0.5


@dataclass(frozen=True)
class SpecTestCell:
    """The cell and tenant `$sys` describes during a spec test (documented in spec-format.md)."""

    region: str = "local"
    cloud: str = "sandbox"
    backup_destination: str = "s3://spec-test/backups"
    subnets: tuple[str, ...] = ("subnet-a", "subnet-b")
    network_id: str = "network-local"
    cidr_range: str = "10.0.0.0/16"
    operator_namespace: str = ""  # "" keeps the spec's x-opsdeck.operator.namespace
    backup_credentials: dict[str, str] = field(
        default_factory=lambda: {"ACCESS_KEY_ID": "spec-test", "ACCESS_SECRET_KEY": "spec-test"}
    )
    tenant_slug: str = "spec-test"
    tenant_name: str = "Spec test"
    user_id: str = "spec-test"
    user_email: str = "spec-test@localhost"

    @classmethod
    def from_cell(cls, cell: Any) -> SpecTestCell:
        """The `$sys` of a registered cell (region, cloud, subnets, network, backup path);
        what the cell does not set keeps its default. Objects still go to the sandbox."""
        labels = cell.labels or {}
        defaults = cls()
        return cls(
            region=cell.region or defaults.region,
            cloud=cell.cloud or defaults.cloud,
            backup_destination=cell.backup_destination or defaults.backup_destination,
            subnets=tuple(labels.get("publicSubnetIDs") or defaults.subnets),
            network_id=labels.get("networkID") or defaults.network_id,
            cidr_range=labels.get("cidrRange") or defaults.cidr_range,
            operator_namespace=cell.operator_namespace,
        )

    @property
    def labels(self) -> dict[str, Any]:
        return {
            "networkID": self.network_id,
            "cidrRange": self.cidr_range,
            "publicSubnetIDs": list(self.subnets),
            "privateSubnetIDs": list(self.subnets),
        }

    def placement(self, instance_id: str) -> executor.Placement:
        """An instance of the pretend tenant on this cell, as the executor runs it."""
        return executor.Placement(
            instance_id=instance_id,
            tenant_slug=self.tenant_slug,
            tenant_name=self.tenant_name,
            user_id=self.user_id,
            user_email=self.user_email,
            region=self.region,
            cloud=self.cloud,
            labels=self.labels,
            backup_destination=self.backup_destination,
            operator_namespace=self.operator_namespace,
            backup_credentials=dict(self.backup_credentials),
        )


@dataclass
class VerbResult:
    """One line of the report: `result` is passed, failed, skipped or not run."""

    verb: str
    result: str
    seconds: float = 0.0
    error: str = ""
    outputs: dict[str, str] = field(default_factory=dict)


@dataclass
class _Instance:
    id: str
    values: dict[str, Any]

    @property
    def namespace(self) -> str:
        return self.id  # as Instance.namespace


def new_instance_id() -> str:
    """`inst-` and 8 lowercase alphanumerics, as the instances of the portal."""
    alphabet = string.ascii_lowercase + string.digits
    return "inst-" + "".join(secrets.choice(alphabet) for _ in range(8))


@contextlib.contextmanager
def sandbox_driver(
    *, speed: float = SPEED, faults: dict[str, Any] | None = None
) -> Iterator[tuple[Any, KubeDriver]]:
    """A fresh in-process sandbox cluster (with `faults` injected, if any) and a driver on it;
    both end with the block."""
    import yaml

    from sandbox.api import Sandbox

    with (
        Sandbox(speed=speed, faults=faults) as sandbox,
        tempfile.TemporaryDirectory(prefix="spec-test-") as tmp,
    ):
        api = api_client_from_kubeconfig(yaml.safe_dump(sandbox.kubeconfig()))
        driver = KubeDriver(api, cache_file=str(Path(tmp) / "discovery.json"))
        try:
            yield sandbox, driver
        finally:
            driver.close()


def modified_parameters(spec: PlanSpec, values: dict[str, Any]) -> dict[str, Any]:
    """What modify asks for: the first modifiable Float64 parameter moved to another allowed
    value (1 → 2), so the modify changes something; no change when no parameter allows one."""
    for parameter in spec.main.parameters:
        if parameter.type != "Float64" or not parameter.modifiable:
            continue
        current = values.get(parameter.key)
        for candidate in _neighbours(parameter, current):
            try:
                check(parameter, candidate)
            except ValueError:
                continue
            return {parameter.key: candidate}
    return {}


def _neighbours(parameter: Parameter, current: Any) -> list[Any]:
    if not isinstance(current, int | float):
        return []
    numbers = [current + 1, current - 1]
    for option in parameter.options or []:
        try:
            number = float(option)
        except ValueError:
            continue
        numbers.append(number)
    return [int(n) if float(n).is_integer() else n for n in numbers if n != current]


class SpecTest:
    """Runs the verbs of one spec on one cluster; `run()` returns a result per line."""

    def __init__(
        self,
        spec: PlanSpec,
        driver: KubeDriver,
        *,
        cell: SpecTestCell | None = None,
        verb_timeout: float = VERB_TIMEOUT,
        on_result: Callable[[VerbResult], None] | None = None,
    ) -> None:
        self.spec = spec
        self.driver = driver
        self.cell = cell or SpecTestCell()
        self.verb_timeout = verb_timeout
        self.on_result = on_result
        self.results: list[VerbResult] = []
        # The backup's $sys.snapshot and outputs, once a backup passed.
        self.snapshot: dict[str, str] | None = None
        self.metadata: dict[str, str] = {}

    # --- the sequence -------------------------------------------------------------------

    def run(self) -> list[VerbResult]:
        """Every system and custom verb, in `ORDER`; absent verbs are skipped, and nothing
        runs after a failed create."""
        verbs = self.spec.main.verbs
        order = list(ORDER)
        order[order.index(CUSTOM_AFTER) + 1 : order.index(CUSTOM_AFTER) + 1] = [
            name for name, verb in verbs.items() if verb.custom
        ]
        instance = _Instance(new_instance_id(), {})
        created = False
        for name in order:
            verb = verbs.get(name)
            if verb is None:
                self._report(VerbResult(name, SKIPPED))
            elif name != "create" and not created:
                self._report(VerbResult(name, NOT_RUN, error="create did not pass"))
            elif name in {"restore", "deleteBackup"} and self.snapshot is None:
                self._report(VerbResult(name, NOT_RUN, error="backup did not pass"))
            elif name == "restore":
                self._restore(verb, instance, self.snapshot)
            else:
                result = self._lifecycle(name, verb, instance)
                created = created or (name == "create" and result.result == PASSED)
        return self.results

    def _lifecycle(self, name: str, verb: Verb, instance: _Instance) -> VerbResult:
        """One verb on the instance, with the parameters and `$sys` extras that verb gets."""
        values, extra_sys = instance.values, {}
        try:
            if name == "create":
                values = validate_parameters(self.spec.main.parameters, {})
            elif name == "modify":
                changes = modified_parameters(self.spec, values)
                values = validate_parameters(self.spec.main.parameters, changes, current=values)
            elif verb.custom and verb.parameters:
                values = {**values, **validate_parameters(verb.parameters, {})}
        except ParameterErrors as exc:
            return self._report(VerbResult(name, FAILED, error=f"parameters: {exc}"))
        snapshot = self.snapshot
        if name == "backup":
            now = datetime.now(UTC)  # named as the portal names snapshots
            snapshot = {"id": f"{instance.id}-{now:%Y%m%d%H%M%S}", "time": now.isoformat()}
        if name in {"backup", "deleteBackup"}:
            extra_sys["snapshot"] = snapshot
        result = self._report(self.run_verb(name, verb, instance, values, extra_sys))
        if result.result == PASSED:
            if name in {"create", "modify"}:
                instance.values = values
            # What a custom verb declares it sets (x-opsdeck.updates), as the portal stores it.
            updates = {t: values[s] for t, s in verb.updates.items() if s in values}
            instance.values = {**instance.values, **updates}
            if name == "backup":  # its outputs are the snapshot's metadata
                self.snapshot, self.metadata = snapshot, result.outputs
        return result

    def _restore(self, verb: Verb, source: _Instance, snapshot: dict[str, str]) -> None:
        """Restore the snapshot into a new instance, then delete that instance again."""
        target = _Instance(new_instance_id(), dict(source.values))
        extra_sys = {
            "restore": {
                "snapshotId": snapshot["id"],
                "snapshotTime": snapshot["time"],
                "targetTime": "",
                "metadata": dict(self.metadata),
            },
            "sourceInstanceId": source.id,
            "targetInstanceId": target.id,
        }
        self._report(self.run_verb("restore", verb, target, target.values, extra_sys))
        delete = self.spec.main.verbs.get("delete")
        if delete is not None:
            result = self.run_verb("delete", delete, target, target.values)
            result.verb = "delete (restored)"
            self._report(result)

    def _report(self, result: VerbResult) -> VerbResult:
        self.results.append(result)
        if self.on_result is not None:
            self.on_result(result)
        return result

    # --- one verb -----------------------------------------------------------------------

    def run_verb(
        self,
        name: str,
        verb: Verb,
        instance: _Instance,
        values: dict[str, Any],
        extra_sys: dict[str, Any] | None = None,
    ) -> VerbResult:
        """Run one verb on `instance` to its end, or until the wall-clock cap."""
        began = time.monotonic()
        operation_id = str(uuid.uuid4())
        started = time.time()
        state = engine.start(verb.workflow, operation_id=operation_id, now=started)
        where = self.cell.placement(instance.id)
        transient = ""
        try:
            # The namespace first for a verb that makes the instance, as the runner does.
            objects = executor.prelude_objects(self.spec, name, where)
            for _ in executor.prelude(self.driver, objects):
                pass
            ctx = executor.run_context(
                self.spec,
                verb,
                where,
                values=values,
                operation_id=operation_id,
                started_at=datetime.fromtimestamp(started, UTC),
                # The plan's default, as a new instance's backup schedule starts with.
                retention_days=plan_retention_days(self.spec.main.backup),
                extra_sys=extra_sys,
            )
            while not state.done:
                if time.monotonic() - began > self.verb_timeout:
                    stuck = self._stuck(verb, state, transient)
                    return VerbResult(name, FAILED, time.monotonic() - began, stuck)
                try:
                    step = executor.move(
                        state, self.spec, verb, ctx, self.driver, where, now=time.time()
                    )
                except TransientError as exc:
                    transient = exc.message  # the runner would retry the step later, too
                    time.sleep(TRANSIENT_SLEEP)
                    continue
                if not step.progressed:
                    time.sleep(IDLE_SLEEP)
        except (DriverError, RenderError) as exc:  # outside any task: the namespace, $sys
            message = exc.message if isinstance(exc, DriverError) else str(exc)
            return VerbResult(name, FAILED, time.monotonic() - began, message)
        seconds = time.monotonic() - began
        if state.phase != engine.SUCCEEDED:
            return VerbResult(name, FAILED, seconds, state.message or "The workflow failed.")
        return VerbResult(name, PASSED, seconds, outputs=engine.verb_outputs(state, verb.outputs))

    def _stuck(self, verb: Verb, state: engine.RunState, transient: str) -> str:
        """Why a verb hit the wall-clock cap: the resource tasks it was still waiting for, each
        with its object's newest Warning event (a quota that refused what it needs, say)."""
        templates = verb.workflow.templates
        waiting = []
        for node in state.nodes.values():
            if not (
                node.phase == engine.RUNNING
                and node.template in templates
                and templates[node.template].resource is not None
            ):
                continue
            said = [node.message] if node.message else []
            if node.object and (warning := engine.last_warning(self.driver, node)):
                said.append(f'its last warning: "{warning}"')
            waiting.append(node.id + (f" ({'; '.join(said)})" if said else ""))
        message = f"did not finish within {self.verb_timeout:g} s"
        if waiting:
            message += f"; still waiting for {', '.join(waiting)}"
        if transient:
            message += f"; last cluster error: {transient}"
        return message


def run(
    spec: PlanSpec,
    driver: KubeDriver,
    *,
    cell: SpecTestCell | None = None,
    verb_timeout: float = VERB_TIMEOUT,
    on_result: Callable[[VerbResult], None] | None = None,
) -> list[VerbResult]:
    """Run every verb of `spec` on the cluster `driver` talks to; see `SpecTest.run`."""
    return SpecTest(spec, driver, cell=cell, verb_timeout=verb_timeout, on_result=on_result).run()
