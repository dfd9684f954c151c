from datetime import timedelta

from django.conf import settings
from django.contrib.auth.models import AbstractUser, BaseUserManager
from django.db import models
from django.db.models import F
from django.db.models.fields.json import KeyTransform
from django.db.models.functions import Collate, Lower
from django.utils import timezone

from accounts.crypto import EncryptedTextField
from accounts.roles import Role


class UserManager(BaseUserManager):
    use_in_migrations = True

    def _create_user(self, email: str, password: str | None, **extra):
        if not email:
            raise ValueError("An email address is required.")
        user = self.model(email=self.normalize_email(email).lower(), **extra)
        user.set_password(password)
        user.save(using=self._db)
        return user

    def create_user(self, email: str, password: str | None = None, **extra):
        extra.setdefault("is_staff", False)
        extra.setdefault("is_superuser", False)
        return self._create_user(email, password, **extra)

    def create_superuser(self, email: str, password: str | None = None, **extra):
        extra.update(is_staff=True, is_superuser=True)
        return self._create_user(email, password, **extra)


class User(AbstractUser):
    """A person who signs in with an email address."""

    username = None
    email = models.EmailField("email address", unique=True)

    USERNAME_FIELD = "email"
    REQUIRED_FIELDS: list[str] = []

    objects = UserManager()

    class Meta(AbstractUser.Meta):
        constraints = [
            # One account per address, whatever its case: the sign-up and the Email page store
            # addresses lowercase, and this holds for every other way in (the admin, a shell).
            models.UniqueConstraint(Lower("email"), name="user_email_once_in_any_case"),
        ]

    def __str__(self) -> str:
        return self.email


class TenantQuerySet(models.QuerySet):
    def live(self) -> "TenantQuerySet":
        """Those not deleted (`Tenant.deleted_at`)."""
        return self.filter(deleted_at=None)

    def for_user(self, user) -> "TenantQuerySet":
        return self.live().filter(memberships__user=user)


class Tenant(models.Model):
    """An organization: it owns deployments, members, invoices and an audit log."""

    name = models.CharField(max_length=100)
    slug = models.SlugField(max_length=50, unique=True)
    created_at = models.DateTimeField(default=timezone.now)
    # The form submission that created it: a repeated submit returns this tenant.
    request_id = models.CharField(max_length=64, blank=True, db_index=True)
    # Deleted by an owner (`services.tenant_delete`): gone from its members' pages and
    # switcher, its row kept with its memberships, invoices and audit log, for the records.
    deleted_at = models.DateTimeField(null=True, blank=True)

    objects = TenantQuerySet.as_manager()

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Membership(models.Model):
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships"
    )
    role = models.CharField(max_length=16, choices=Role.choices)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["tenant__name", "user__email"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "user"], name="membership_unique_user")
        ]

    def __str__(self) -> str:
        return f"{self.user} in {self.tenant} ({self.role})"


class Invitation(models.Model):
    """An invitation by email; the link carries a signed id and works once."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="invitations")
    email = models.EmailField()
    role = models.CharField(max_length=16, choices=Role.choices)
    invited_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)
    accepted_at = models.DateTimeField(null=True, blank=True)
    accepted_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
    )
    revoked_at = models.DateTimeField(null=True, blank=True)
    request_id = models.CharField(max_length=64, blank=True, db_index=True)
    # The invitation is its email's outbox (`services.invitation_email_send`): a worker claims
    # an attempt (`email_attempted_at`, counted in `email_attempts`) before it sends and records
    # when the mail server took it (`emailed_at`); beat sends again the ones still unsent, up to
    # EMAIL_ATTEMPTS attempts in all.
    EMAIL_ATTEMPTS = 5
    emailed_at = models.DateTimeField(null=True, blank=True)
    email_attempted_at = models.DateTimeField(null=True, blank=True)
    email_attempts = models.PositiveSmallIntegerField(default=0)

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            models.Index(
                fields=["created_at"],
                name="invitation_unsent",
                condition=models.Q(emailed_at=None, accepted_at=None, revoked_at=None),
            )
        ]
        # One open invitation per address in an organization: a newer one replaces it
        # (`services.invitation_create`). An expired one counts until the next replaces it.
        constraints = [
            models.UniqueConstraint(
                models.F("tenant"),
                Lower("email"),
                condition=models.Q(accepted_at=None, revoked_at=None),
                name="invitation_open_once",
            )
        ]

    def __str__(self) -> str:
        return f"{self.email} to {self.tenant} ({self.role})"

    @property
    def email_undeliverable(self) -> bool:
        """Whether every attempt to send its email failed (beat tries no more)."""
        return self.emailed_at is None and self.email_attempts >= self.EMAIL_ATTEMPTS

    @property
    def expires_at(self):
        return self.created_at + timedelta(seconds=settings.OPSDECK_INVITATION_MAX_AGE)

    @property
    def status(self) -> str:
        if self.accepted_at:
            return "accepted"
        if self.revoked_at:
            return "revoked"
        if timezone.now() >= self.expires_at:
            return "expired"
        return "pending"


class ApiTokenQuerySet(models.QuerySet):
    def live(self) -> "ApiTokenQuerySet":
        """Those that may act: not revoked, not expired, of an organization not deleted."""
        return self.filter(revoked_at=None, tenant__deleted_at=None).filter(
            models.Q(expires_at=None) | models.Q(expires_at__gt=timezone.now())
        )


class ApiToken(models.Model):
    """An organization's API token: a secret that acts with `role` in `tenant` through the
    API (`Authorization: Bearer <secret>`). Only the secret's SHA-256 is kept, with its first
    characters (`prefix`) so people can tell tokens apart; the secret is shown once.

    It lives as long as its organization, until revoked or expired: it belongs to the
    organization, not to who made it, so a script keeps working when that person leaves."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=100)
    role = models.CharField(max_length=16, choices=Role.choices)
    prefix = models.CharField(max_length=16)
    digest = models.CharField(max_length=64, unique=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    # Kept as text so the page still names who made it once their account is gone.
    created_by_email = models.CharField(max_length=254, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    objects = ApiTokenQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at", "-id"]
        verbose_name = "API token"

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…) in {self.tenant}"

    @property
    def audit_name(self) -> str:
        return self.name

    @property
    def label(self) -> str:
        """How the audit log and an instance's activity name what the token did."""
        return f"API token “{self.name}” ({self.prefix}…)"

    @property
    def status(self) -> str:
        if self.revoked_at:
            return "revoked"
        if self.expires_at and timezone.now() >= self.expires_at:
            return "expired"
        return "active"


class AppendOnlyError(Exception):
    """Audit events are never changed or deleted."""


# What names an audit event's target, in the payloads events carry: a member's or invitee's
# address, an organization's or instance's name, a subscription's plan, a backup.
TARGET_NAMES = ("email", "name", "plan", "snapshot")


class AuditEventQuerySet(models.QuerySet):
    def update(self, **kwargs):
        raise AppendOnlyError("Audit events cannot be updated.")

    def delete(self):
        raise AppendOnlyError("Audit events cannot be deleted.")

    def for_tenant(self, tenant: Tenant) -> "AuditEventQuerySet":
        return self.filter(tenant=tenant)


class AuditEvent(models.Model):
    """One recorded action: who did what to which object, and how it ended."""

    class ActorKind(models.TextChoices):
        USER = "user", "User"
        STAFF = "staff", "Platform staff"
        SYSTEM = "system", "System"
        TOKEN = "token", "API token"

    class Result(models.TextChoices):
        OK = "ok", "OK"
        DENIED = "denied", "Denied"
        ERROR = "error", "Error"

    created_at = models.DateTimeField(default=timezone.now, db_index=True)
    tenant = models.ForeignKey(
        Tenant, null=True, blank=True, on_delete=models.PROTECT, related_name="audit_events"
    )
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # Kept as text so the log still names a person after their account is deleted; for an API
    # token, its label (`ApiToken.label`).
    actor_email = models.CharField(max_length=254, blank=True)
    actor_kind = models.CharField(max_length=8, choices=ActorKind.choices)
    action = models.CharField(max_length=64, db_index=True)
    target_type = models.CharField(max_length=64, blank=True)
    target_id = models.CharField(max_length=64, blank=True)
    # What the target was called when the event happened (its `audit_name`: an instance's
    # name), kept as text: the log still names it once it is renamed or gone.
    target_name = models.CharField(max_length=200, blank=True)
    ip = models.GenericIPAddressField(null=True, blank=True)
    user_agent = models.CharField(max_length=300, blank=True)
    result = models.CharField(max_length=8, choices=Result.choices, default=Result.OK)
    payload = models.JSONField(default=dict, blank=True)

    objects = AuditEventQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            models.Index(fields=["tenant", "-created_at"], name="audit_tenant_created"),
            # The actions of an organization's log, which its filter offers
            # (`selectors.audit_actions_for_tenant`): ordered byte by byte, which no filter
            # compares by, so none is counted along it.
            models.Index(F("tenant"), Collate("action", "C"), name="audit_tenant_action_c"),
            # An object's events (an instance's Activity tab), and the events whose payload
            # names their source (a restore, the instance its backup was taken of).
            models.Index(fields=["target_type", "target_id"], name="audit_target"),
            models.Index(
                KeyTransform("source", "payload"),
                name="audit_source",
                condition=models.Q(payload__has_key="source"),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.action} by {self.actor_email or self.actor_kind} ({self.result})"

    def save(self, *args, **kwargs):
        if not self._state.adding:
            raise AppendOnlyError("Audit events cannot be updated.")
        super().save(*args, **kwargs)

    def delete(self, *args, **kwargs):
        raise AppendOnlyError("Audit events cannot be deleted.")

    @property
    def target_named(self) -> str:
        """Who or what the target is: its name when the event was recorded, else the one its
        payload says (events recorded before names were kept); "" when neither does."""
        if self.target_name:
            return self.target_name
        payload = self.payload if isinstance(self.payload, dict) else {}
        named = next((payload[key] for key in TARGET_NAMES if payload.get(key)), None)
        return str(named) if isinstance(named, str | int) else ""

    @property
    def target_shown(self) -> str:
        """The target as the log shows it: its kind and id, and who or what it is when the
        event says ("membership 6 (bob@example.com)"); "" without a target."""
        if not self.target_type:
            return ""
        shown = f"{self.target_type} {self.target_id}"
        return f"{shown} ({self.target_named})" if self.target_named else shown


class RequestKey(models.Model):
    """A request id used within a scope (an organization, or a user for what lives outside one).

    Like Stripe's Idempotency-Key: a repeat of the request returns what the first one made,
    the same id with another action or input is refused. The unique constraint makes a
    concurrent repeat wait for the first request's transaction, then find its key.
    """

    scope = models.CharField(max_length=40)  # "tenant:<id>" or "user:<id>"
    request_id = models.CharField(max_length=64)
    action = models.CharField(max_length=64)
    digest = models.CharField(max_length=64)  # of the action and the input as submitted
    target_type = models.CharField(max_length=64, blank=True)
    target_id = models.CharField(max_length=64, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["scope", "request_id"], name="requestkey_once")
        ]
        # The oldest are forgotten daily (`idempotency.request_ids_prune`).
        indexes = [models.Index(fields=["created_at"], name="requestkey_created")]

    def __str__(self) -> str:
        return f"{self.action} {self.request_id} in {self.scope}"


class OutgoingEmail(models.Model):
    """An email on its way to the mail server (`accounts.mail`): written in the transaction that
    has something to say, so it goes out when and only when that commits, and kept until the
    mail server takes it, whatever becomes of the broker's message that asks the mail worker to
    send it. A sent email is deleted; one given up on (refused, or failing for
    OPSDECK_EMAIL_GIVE_UP_HOURS) stays OPSDECK_EMAIL_GIVEN_UP_KEPT_DAYS for the staff to see."""

    to = models.JSONField()  # the addresses, every one in the email's To
    subject = models.TextField()
    # Encrypted at rest: a sign-in, confirmation or password-reset link is as good as a
    # password while it waits here.
    body = EncryptedTextField()
    html = EncryptedTextField(blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    # When beat sends it to the mail worker if no attempt has taken it by then: a minute after
    # it was written (its own message lost), after a failed attempt as the back-off says.
    next_attempt_at = models.DateTimeField()
    # An attempt under way holds the email until then: no other worker sends it meanwhile.
    claimed_until = models.DateTimeField(null=True, blank=True)
    attempts = models.PositiveIntegerField(default=0)
    last_error = models.TextField(blank=True)
    given_up_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            models.Index(
                fields=["next_attempt_at"], name="email_due", condition=models.Q(given_up_at=None)
            ),
            models.Index(
                fields=["given_up_at"],
                name="email_given_up",
                condition=models.Q(given_up_at__isnull=False),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.subject} to {', '.join(self.to)}"
