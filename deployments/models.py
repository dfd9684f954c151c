import json
import re
import secrets
import string
import uuid
from collections.abc import Iterable
from datetime import datetime

from django.conf import settings
from django.core.validators import RegexValidator
from django.db import models
from django.db.models.functions import Lower
from django.utils import timezone

from accounts.crypto import EncryptedTextField
from accounts.models import Tenant
from billing.models import Plan
from deployments.lifecycle import InstanceState

_ID_ALPHABET = string.ascii_lowercase + string.digits


def new_instance_id() -> str:
    """`inst-` and 8 lowercase alphanumerics: a valid DNS label, and the namespace's name."""
    return "inst-" + "".join(secrets.choice(_ID_ALPHABET) for _ in range(8))


INSTANCE_ID = re.compile(r"inst-[a-z0-9]{8}")  # what `new_instance_id` makes (fullmatch)


class CellQuerySet(models.QuerySet):
    def offered_to(self, tenant: Tenant) -> "CellQuerySet":
        """The cells `tenant` may run instances on: the public ones and its private ones."""
        return self.filter(models.Q(public=True) | models.Q(tenants=tenant)).distinct()


class Cell(models.Model):
    """A Kubernetes cluster that hosts instances (a deployment cell)."""

    class DeploymentModel(models.TextChoices):
        HOSTED = "hosted", "Hosted"
        BYOC = "byoc", "Bring your own cloud"
        ONPREM = "onprem", "On-premises"

    name = models.SlugField(max_length=63, unique=True)
    region = models.CharField(max_length=64, blank=True)
    cloud = models.CharField(max_length=32, blank=True)
    deployment_model = models.CharField(
        max_length=8, choices=DeploymentModel.choices, default=DeploymentModel.HOSTED
    )
    # Empty means the in-cluster configuration of the worker's own pod.
    kubeconfig = EncryptedTextField(blank=True)
    context = models.CharField(max_length=253, blank=True)
    # Where the operators run in this cluster, when not where the plans' specs say
    # (x-opsdeck.operator.namespace); empty: the spec's.
    operator_namespace = models.CharField(
        max_length=63,
        blank=True,
        help_text="The operators' namespace in this cluster; empty: the one each plan names.",
    )
    backup_destination = models.CharField(max_length=500, blank=True)
    # JSON {"ACCESS_KEY_ID": ..., "ACCESS_SECRET_KEY": ...} for the object store.
    backup_credentials = EncryptedTextField(blank=True)
    # CIDRs allowed to reach an instance's service port.
    customer_sources = models.JSONField(default=list, blank=True)
    labels = models.JSONField(default=dict, blank=True)
    is_default = models.BooleanField(default=False)
    # Who may run instances here: every tenant when public, else only the tenants listed.
    public = models.BooleanField(
        default=True, help_text="Offered to every organization; else only to those listed."
    )
    tenants = models.ManyToManyField(
        Tenant,
        blank=True,
        related_name="private_cells",
        help_text="The organizations a private cell is offered to.",
    )
    created_at = models.DateTimeField(default=timezone.now)
    # When the status sync last read the status objects the cell watcher streams in this cell
    # (`status.cell_observe`): while the watcher streams them, it reads them only this often.
    status_read_at = models.DateTimeField(null=True, blank=True, editable=False)
    # Counted up by each change of the settings its instances' guard rails are rendered with
    # (`cells.NAMESPACE_SETTINGS`); the count as of the last pass that applied them again in
    # the namespace of every instance (add_cell's): as a resource's generation and its
    # controller's observedGeneration.
    settings_generation = models.PositiveBigIntegerField(default=0, editable=False)
    guard_rails_generation = models.PositiveBigIntegerField(default=0, editable=False)
    # Until when a pass applying them (`services.cell_namespaces_apply`) holds the cell: the
    # cell watcher's catch-up does not run beside one. Renewed as the pass goes, cleared at its
    # end; a pass whose process died lets it lapse.
    guard_rails_pass_until = models.DateTimeField(null=True, blank=True, editable=False)

    objects = CellQuerySet.as_manager()

    class Meta:
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(
                fields=["is_default"],
                condition=models.Q(is_default=True),
                name="cell_one_default",
            )
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def guard_rails_behind(self) -> bool:
        """Whether an instance's namespace may hold guard rails rendered with settings the cell
        had before their last change: no pass applying them again has ended since it, or
        the one that ended could not reach some instance."""
        return self.guard_rails_generation < self.settings_generation


class PlanVersion(models.Model):
    """One released spec text of a plan; instances stay on theirs until upgraded."""

    plan = models.ForeignKey(Plan, on_delete=models.PROTECT, related_name="versions")
    number = models.PositiveIntegerField()
    spec_text = models.TextField()
    parsed = models.JSONField(default=dict)  # the spec's YAML as data, for queries and the admin
    digest = models.CharField(max_length=64)
    released_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["plan", "-number"]
        constraints = [
            models.UniqueConstraint(fields=["plan", "number"], name="planversion_number"),
        ]

    def __str__(self) -> str:
        return f"{self.plan.key} v{self.number}"


class InstanceQuerySet(models.QuerySet):
    def for_tenant(self, tenant: Tenant) -> "InstanceQuerySet":
        return self.filter(tenant=tenant)

    def active(self) -> "InstanceQuerySet":
        return self.exclude(state=Instance.State.DELETED)


class Instance(models.Model):
    """A customer's running service: one namespace and the objects its workflows made."""

    State = InstanceState  # which verb moves it from which state to which: `lifecycle`

    class Health(models.TextChoices):
        HEALTHY = "healthy", "Healthy"
        DEGRADED = "degraded", "Degraded"

    id = models.CharField(primary_key=True, max_length=13, default=new_instance_id, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="instances")
    name = models.CharField(max_length=100)
    plan_version = models.ForeignKey(PlanVersion, on_delete=models.PROTECT, related_name="+")
    cell = models.ForeignKey(Cell, on_delete=models.PROTECT, related_name="instances")
    # Parameter values without the Password ones, which live encrypted in `secret_parameters`.
    parameters = models.JSONField(default=dict)
    secret_parameters = EncryptedTextField(blank=True)
    state = models.CharField(max_length=10, choices=State.choices, default=State.CREATING)
    # The operator's last status of the instance's main object (x-opsdeck.status), and when it
    # was read.
    observed = models.JSONField(default=dict, blank=True)
    observed_at = models.DateTimeField(null=True, blank=True)
    # Whether it serves as its plan's health rule says (`deployments.health`), beside its state:
    # Degraded once the observed status failed the rule for a while (since `unhealthy_since`),
    # with the operator's reason then; meaningful while it runs.
    health = models.CharField(max_length=10, choices=Health.choices, default=Health.HEALTHY)
    health_reason = models.CharField(max_length=500, blank=True)
    unhealthy_since = models.DateTimeField(null=True, blank=True)
    outputs = models.JSONField(default=dict, blank=True)
    # While on, a delete is refused (owners and admins turn it off first).
    deletion_protected = models.BooleanField(default=False)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    # The organization's API token that created (or restored) it, when one did.
    created_by_token = models.ForeignKey(
        "accounts.ApiToken", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)

    objects = InstanceQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]
        # The table keeps a fifth of each page free for the status the cell watcher writes
        # (`fillfactor`, migration 0026): updated in its page, it adds no index entry.
        indexes = [
            models.Index(fields=["tenant", "state"], name="instance_tenant_state"),
            # The staff's list of the fleet: a page, newest first, without sorting it all.
            models.Index(fields=["created_at", "id"], name="instance_created"),
        ]
        constraints = [
            # The name a customer knows an instance by: one per organization, whatever its
            # case, until the instance is deleted (`services._instance_new` says so).
            models.UniqueConstraint(
                "tenant",
                Lower("name"),
                condition=~models.Q(state=InstanceState.DELETED),
                name="instance_name_once",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.id})"

    @property
    def audit_name(self) -> str:
        """What the audit log calls it, beside its id."""
        return self.name

    @property
    def namespace(self) -> str:
        return self.id


class InstanceStateChange(models.Model):
    """Every state an instance went through, with when: metering and the activity tab read it."""

    instance = models.ForeignKey(Instance, on_delete=models.CASCADE, related_name="history")
    from_state = models.CharField(max_length=10, blank=True)
    to_state = models.CharField(max_length=10)
    at = models.DateTimeField(default=timezone.now, db_index=True)
    operation = models.ForeignKey(
        "Operation", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    reason = models.CharField(max_length=500, blank=True)

    class Meta:
        ordering = ["instance", "at", "id"]

    def __str__(self) -> str:
        return f"{self.instance_id}: {self.from_state or '-'} → {self.to_state}"


class Operation(models.Model):
    """One run of a verb's workflow on an instance; its progress lives here."""

    class State(models.TextChoices):
        QUEUED = "queued", "Queued"
        RUNNING = "running", "Running"
        SUCCEEDED = "succeeded", "Succeeded"
        FAILED = "failed", "Failed"
        CANCELLED = "cancelled", "Cancelled"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    instance = models.ForeignKey(Instance, on_delete=models.PROTECT, related_name="operations")
    verb = models.CharField(max_length=64)
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # The organization's API token that asked for it, when one did (then no user did).
    requested_by_token = models.ForeignKey(
        "accounts.ApiToken", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    request_id = models.CharField(max_length=64)
    plan_version = models.ForeignKey(PlanVersion, on_delete=models.PROTECT, related_name="+")
    # What the request asked for: the parameter values it changes (all of them for a create or
    # restore), and encrypted, {"parameters": …, "verb_parameters": …} of its Password values.
    requested = models.JSONField(default=dict, blank=True)
    requested_secret = EncryptedTextField(blank=True)
    # The whole parameter set the run applies, worked out when it starts from the instance's
    # parameters then and the changes requested (Password values encrypted apart).
    parameters = models.JSONField(default=dict)
    secret_parameters = EncryptedTextField(blank=True)
    arguments = models.JSONField(default=dict, blank=True)  # verb-specific (snapshot, target)
    state = models.CharField(max_length=10, choices=State.choices, default=State.QUEUED)
    # The engine's RunState as JSON; encrypted because rendered objects may hold secrets.
    # Several kilobytes of JSON written on every move: compressed, it takes half the TOAST
    # chunks (and WAL) each time.
    engine_state = EncryptedTextField(blank=True, compressed=True)
    created_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)  # time inside the run is frozen here
    finished_at = models.DateTimeField(null=True, blank=True)
    next_step_at = models.DateTimeField(null=True, blank=True)
    # The worker advancing it: a token claimed until a time (`runner`), so that no transaction
    # or row lock stays open through a call to the cluster.
    claim_token = models.UUIDField(null=True, blank=True)
    claimed_until = models.DateTimeField(null=True, blank=True)
    # While it waits: the objects in its instance's namespace whose change may move it on, with
    # their conditions as rendered (`engine.waiting_on`); the cell watcher wakes it when a change
    # decides one (while empty, on any change of a kind it watches).
    waiting_on = models.JSONField(default=list, blank=True)
    # Engine moves made (each a committed transaction), for the record and the benchmark.
    moves = models.PositiveIntegerField(default=0)
    # Steps in a row that found nothing to do: the poll interval grows with them.
    idle_steps = models.PositiveIntegerField(default=0)
    transient_failures = models.PositiveIntegerField(default=0)  # all of them, for the record
    # Transient failures since the last step that got through: the back-off grows with these.
    transient_streak = models.PositiveIntegerField(default=0)
    # Moves in a row stopped by an error of Opsdeck's own (a fault, not the cluster's): each
    # is tried again after a longer delay, and the run fails at `runner.FAULTS_BEFORE_FAILING`.
    fault_streak = models.PositiveIntegerField(default=0)
    # Set by a delete of the instance: the run stops at its next step (its onExit still runs).
    cancel_reason = models.CharField(max_length=300, blank=True)
    error = models.TextField(blank=True)
    outputs = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["instance", "request_id"], name="operation_request_once"
            )
        ]
        # The operations not finished, for the sweeper that finds the stalled ones. No column
        # a move writes is indexed (`next_step_at` was): PostgreSQL then updates the row in its
        # page (a HOT update) instead of adding an entry to each of the table's indexes, and
        # the table keeps room in its pages for that (`fillfactor`, migration 0025).
        # Its condition is `finished_at`, not the live states that a run's statements filter
        # on beside an operation's id or instance: so none of them can be planned on it. With
        # statistics from an ANALYZE that ran while little was in flight, this index looks
        # nearly empty, and a plan on it reads every operation in flight to find one.
        # The staff's list of every operation, newest first, reads one page along
        # `operation_created`.
        indexes = [
            models.Index(
                fields=["created_at"],
                name="operation_unfinished",
                condition=models.Q(finished_at__isnull=True),
            ),
            models.Index(fields=["created_at"], name="operation_created"),
        ]

    def __str__(self) -> str:
        return f"{self.verb} on {self.instance_id} ({self.state})"

    @property
    def audit_name(self) -> str:
        """What the audit log calls it, beside its id: "restart of orders"."""
        return f"{self.verb} of {self.instance.name}"


class TaskRun(models.Model):
    """One attempt of one task of an operation, with the exact object it rendered."""

    operation = models.ForeignKey(Operation, on_delete=models.CASCADE, related_name="task_runs")
    node = models.CharField(max_length=300)
    attempt = models.PositiveIntegerField(default=1)
    state = models.CharField(max_length=12)
    message = models.TextField(blank=True)
    object = EncryptedTextField(blank=True, compressed=True)  # JSON of the rendered object
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["operation", "started_at", "id"]
        constraints = [
            models.UniqueConstraint(fields=["operation", "node", "attempt"], name="taskrun_once")
        ]

    def __str__(self) -> str:
        return f"{self.node} #{self.attempt} ({self.state})"


class Snapshot(models.Model):
    """A backup in the object store; it outlives its instance until deleted or expired."""

    class Status(models.TextChoices):
        PENDING = "pending", "Pending"
        COMPLETED = "completed", "Completed"
        FAILED = "failed", "Failed"
        CANCELLED = "cancelled", "Cancelled"  # its backup was cancelled (or a delete came first)
        DELETED = "deleted", "Deleted"

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="snapshots")
    instance = models.ForeignKey(
        Instance, null=True, blank=True, on_delete=models.SET_NULL, related_name="snapshots"
    )
    source_instance_id = models.CharField(max_length=13)
    plan_version = models.ForeignKey(PlanVersion, on_delete=models.PROTECT, related_name="+")
    name = models.CharField(max_length=253)
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PENDING)
    metadata = models.JSONField(default=dict, blank=True)  # the backup verb's outputs
    # The instance's parameters (Password ones left out) when the backup ran: a restore keeps
    # those that cannot change, also after the instance is gone.
    parameters = models.JSONField(default=dict, blank=True)
    operation = models.ForeignKey(
        Operation, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)  # when the backup was asked for
    # When its backup completed, which may be long after it was asked for (queued behind a
    # change): the data it holds is as of then. None until it completes.
    taken_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    # Taken by the instance's backup schedule: only these count towards its retention count.
    scheduled = models.BooleanField(default=False)

    class Meta:
        ordering = ["-created_at"]
        # The staff's list, newest first, reads one page along it.
        indexes = [models.Index(fields=["created_at"], name="snapshot_created")]

    def __str__(self) -> str:
        return self.name

    @property
    def taken(self) -> datetime:
        """When the data it holds is as of: its backup's completion (when it was asked for
        for one that completed before this was recorded)."""
        return self.taken_at or self.created_at


class BackupSchedule(models.Model):
    """When an instance is backed up (every N hours or a cron expression) and how long its
    snapshots are kept; the operator keeps how a backup is taken."""

    class Outcome(models.TextChoices):
        RAN = "ran", "Backup queued"
        SKIPPED = "skipped", "Skipped"

    instance = models.OneToOneField(
        Instance, primary_key=True, on_delete=models.CASCADE, related_name="backup_schedule"
    )
    # One of the two: every `interval_hours` hours, or at the times of `cron` (5 fields, UTC).
    interval_hours = models.PositiveIntegerField(null=True, blank=True)
    cron = models.CharField(max_length=100, blank=True)
    # Every snapshot expires after `retention_days` (the object store's retention policy);
    # `retention_count`, when set, also keeps only that many scheduled ones.
    retention_days = models.PositiveIntegerField()
    # The retention the cluster holds: the one the last create, restore or applyBackupRetention
    # that succeeded rendered (None: not known, taken to be `retention_days`). A retention
    # saved but not applied (its apply cancelled or failed) is applied again when saved again.
    retention_days_applied = models.PositiveIntegerField(null=True, blank=True)
    retention_count = models.PositiveIntegerField(null=True, blank=True)
    enabled = models.BooleanField(default=True)
    next_run_at = models.DateTimeField(null=True, blank=True)
    last_slot_at = models.DateTimeField(null=True, blank=True)
    last_outcome = models.CharField(max_length=10, choices=Outcome.choices, blank=True)
    last_reason = models.CharField(max_length=500, blank=True)
    last_operation = models.ForeignKey(
        Operation, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        indexes = [models.Index(fields=["enabled", "next_run_at"], name="backupschedule_due")]

    def __str__(self) -> str:
        return f"backups of {self.instance_id}"

    @property
    def settings_token(self) -> str:
        """What its owners set, as one string: the schedule form sends the one it showed, so
        a save from a page opened before someone else's change is told rather than undoing
        it (a backup run moving `next_run_at` is no change)."""
        values = (self.interval_hours, self.cron, self.retention_days, self.retention_count)
        return "|".join("" if v is None else str(v) for v in values) + f"|{int(self.enabled)}"

    @staticmethod
    def settings_of_token(token: object) -> dict | None:
        """A `settings_token` read back, each value as the schedule form's field holds it
        (text, and `enabled` a bool); None for anything no schedule gave."""
        parts = token.split("|") if isinstance(token, str) else []
        if len(parts) != 5 or parts[4] not in ("0", "1"):
            return None
        interval_hours, cron, retention_days, retention_count, enabled = parts
        return {
            "timing": "cron" if cron else "interval",
            "interval_hours": interval_hours,
            "cron": cron,
            "retention_days": retention_days,
            "retention_count": retention_count,
            "enabled": enabled == "1",
        }


# A platform secret's name, as a spec reads it (`$secret.NAME`).
SECRET_NAME = r"[A-Za-z_][A-Za-z0-9_]*"  # noqa: S105 - a pattern, not a secret


class PlatformSecret(models.Model):
    """A secret the platform team sets for specs to use as `$secret.<NAME>` (stored encrypted)."""

    name = models.CharField(
        max_length=100,
        unique=True,
        validators=[
            RegexValidator(rf"^{SECRET_NAME}$", "Letters, digits and _; not a digit first.")
        ],
    )
    value = EncryptedTextField()
    description = models.CharField(max_length=300, blank=True)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class CellWatchLease(models.Model):
    """Which `watch_cells` process watches a cell: the holder until `expires_at` (renewed while
    it runs), and a rising `epoch` given at each takeover. Every write the watcher makes checks
    its holder and epoch here in the same statement, so a process that lost the lease (stuck,
    or partitioned) cannot write after another took over. A row, not a session advisory lock:
    those do not survive a pooler in transaction mode."""

    cell = models.OneToOneField(Cell, on_delete=models.CASCADE, primary_key=True, related_name="+")
    holder = models.CharField(max_length=200)
    epoch = models.BigIntegerField(default=1)
    expires_at = models.DateTimeField()
    # The kinds whose watch streams, as of the last renewal (`kinds_value`): an operation
    # waiting only on objects of these is woken by their changes, and polls slowly.
    watching = models.JSONField(default=list)

    def __str__(self) -> str:
        return f"{self.cell_id}: {self.holder} (epoch {self.epoch})"

    @staticmethod
    def kinds_value(kinds: Iterable[tuple[str, str]]) -> str:
        """(apiVersion, kind) pairs as `watching` holds them: a JSON array of "apiVersion/Kind"."""
        return json.dumps(sorted(f"{api_version}/{kind}" for api_version, kind in kinds))

    def streamed(self) -> set[tuple[str, str]]:
        """The (apiVersion, kind) pairs `watching` holds (`kinds_value`, read back)."""
        return {tuple(kind.rsplit("/", 1)) for kind in self.watching}


class ServerSample(models.Model):
    """One minute of one server's (pod's) CPU and memory use, as the cluster's metrics API
    reported it: taken every minute while the instance runs, kept a day, after which its hour
    is kept as a `ServerHour` (`metrics`)."""

    # Indexed by the unique constraint, which starts with it.
    instance = models.ForeignKey(
        Instance, on_delete=models.CASCADE, related_name="+", db_index=False
    )
    server = models.CharField(max_length=253)  # the pod's name
    role = models.CharField(max_length=63, blank=True)  # e.g. primary or replica, when known
    minute = models.DateTimeField()  # when it was taken, truncated to the minute
    cpu = models.PositiveIntegerField()  # millicores
    memory = models.PositiveBigIntegerField()  # bytes

    class Meta:
        constraints = [
            # Also the index that reads one instance's window.
            models.UniqueConstraint(
                fields=["instance", "minute", "server"], name="serversample_once"
            )
        ]
        indexes = [models.Index(fields=["minute"], name="serversample_minute")]  # pruning

    def __str__(self) -> str:
        return f"{self.server} at {self.minute:%Y-%m-%d %H:%M}"


class ServerHour(models.Model):
    """One hour of one server's CPU and memory use: the average of its minute samples
    (`ServerSample`), rolled up once the hour ended and kept 7 days (`metrics.hours_roll_up`)."""

    # Indexed by the unique constraint, which starts with it.
    instance = models.ForeignKey(
        Instance, on_delete=models.CASCADE, related_name="+", db_index=False
    )
    server = models.CharField(max_length=253)
    role = models.CharField(max_length=63, blank=True)  # the hour's (the greatest, if it changed)
    hour = models.DateTimeField()  # when it began
    cpu = models.FloatField()  # millicores, the average of the hour's samples
    memory = models.FloatField()  # bytes, the average of the hour's samples
    samples = models.PositiveSmallIntegerField()  # how many minutes were sampled

    class Meta:
        constraints = [
            # Also the index that reads one instance's window.
            models.UniqueConstraint(fields=["instance", "hour", "server"], name="serverhour_once")
        ]
        indexes = [models.Index(fields=["hour"], name="serverhour_hour")]  # the last, pruning

    def __str__(self) -> str:
        return f"{self.server} at {self.hour:%Y-%m-%d %H}h"


class FleetRun(models.Model):
    """A fleet action platform staff confirmed in the admin (`admin.InstanceAdmin`): a worker
    queues its operations a batch at a time (`fleet.fleet_run_advance`), so that no web request
    waits on thousands of them; its admin page says how far it is and what was refused."""

    # The confirmation page's: sent twice (a reload, a double click), it starts one run.
    request_id = models.CharField(max_length=32, unique=True)
    verb = models.CharField(max_length=64)  # upgrade, restart, stop or start
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    requested_ip = models.GenericIPAddressField(null=True, blank=True)
    # [instance id, the plan version the page showed it (an upgrade's) or None], as listed.
    selection = models.JSONField()
    handled = models.PositiveIntegerField(default=0)  # how many of `selection`, from its start
    queued = models.PositiveIntegerField(default=0)
    refused = models.JSONField(default=list)  # [instance, why], as handled
    # A rollout in waves: `wave` instances at a time, the next wave queued once every operation
    # of the last has ended; null: every instance at once (queued `fleet.BATCH` at a time).
    wave = models.PositiveSmallIntegerField(null=True, blank=True)
    # How many of its operations may fail before it stops queuing more (waves only); `failed`
    # counts those of the waves that ended.
    failures_allowed = models.PositiveIntegerField(default=0)
    failed = models.PositiveIntegerField(default=0)
    # Why it ended before queuing on every instance it had left (a failure too many, staff
    # stopping it): said on its page, each instance left refused for it.
    stopped = models.TextField(blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    # A worker advancing it holds it until then; one that died lets beat send it again.
    claimed_until = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [
            models.Index(
                fields=["created_at"],
                name="fleetrun_unfinished",
                condition=models.Q(finished_at=None),
            )
        ]

    def __str__(self) -> str:
        # Not its number of instances: a list of runs would read each one's whole selection.
        return f"{self.verb} run of {self.created_at:%Y-%m-%d %H:%M}"
