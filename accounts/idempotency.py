"""One object per request id: what every create and action form relies on against double submits.

A service calls `request_claim` after its permission check and inside its transaction. The
claim inserts a `RequestKey` row; a concurrent request with the same id waits on the unique
index until the first one commits (or rolls back), so the check and the write cannot race.
Rows are kept `OPSDECK_REQUEST_IDS_KEPT_DAYS` days (`request_ids_prune`).
"""

from __future__ import annotations

import hashlib
import json
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import connection, models
from django.utils import timezone
from django.utils.crypto import salted_hmac

from accounts.models import RequestKey, Tenant

REQUEST_ID_MAX = RequestKey._meta.get_field("request_id").max_length

# Said of the form as a whole: the request id is a hidden field nobody can correct.
REUSED = (
    "This form was already sent with different values. Check what it made, or fill the form "
    "in again to send it anew."
)
UNREADABLE = "The values sent cannot be read: a number is too long or a value nests too deeply."


# What begins each request id Opsdeck makes itself, for an operation no request sent: a
# schedule's slot, a pruned backup, or one derived from a request (a delete's last backup, a
# plan change's upgrades, a suspended subscription's stops). A request may not send an id that
# begins so: its operation would take the place of the system's (an instance holds one
# operation per request id), and the system's would then fail. (A fleet run's are its
# instances' own requests, under the run's random id, which only staff see.)
SYSTEM_PURPOSES = frozenset({"schedule", "prune", "last-snapshot", "plan-change", "suspended-stop"})
RESERVED = "This request id is one Opsdeck keeps for its own requests."


def request_id_clean(request_id: str | None) -> str:
    """The request id to use: a new one when none is given; ValidationError when it is unusable."""
    if request_id is None or request_id == "":
        return uuid.uuid4().hex
    if not isinstance(request_id, str):
        raise ValidationError({"request_id": "The request id must be text."})
    if len(request_id) > REQUEST_ID_MAX:
        raise ValidationError(
            {"request_id": f"The request id is longer than {REQUEST_ID_MAX} characters."}
        )
    if not request_id.isprintable() or request_id.strip() != request_id:
        raise ValidationError({"request_id": "The request id may hold only printable characters."})
    if system_made(request_id):
        raise ValidationError({"request_id": RESERVED})
    return request_id


def system_made(request_id: str) -> bool:
    """Whether the request id is one Opsdeck made for an operation it asked for itself."""
    return any(request_id.startswith(f"{purpose}-") for purpose in SYSTEM_PURPOSES)


def system_request_id(purpose: str, *parts: object) -> str:
    """The request id of an operation Opsdeck asks for itself (`SYSTEM_PURPOSES`), from what
    makes it one of a kind: `schedule-<slot>`, `prune-<snapshot>`; no request may send it."""
    if purpose not in SYSTEM_PURPOSES:
        raise ValueError(f"no system request purpose {purpose!r}")
    return "-".join([purpose, *(str(part) for part in parts)])


def tenant_scope(tenant: Tenant) -> str:
    return f"tenant:{tenant.pk}"


def user_scope(user: Any) -> str:
    return f"user:{user.pk}"


def derived_request_id(request_id: str, purpose: str) -> str:
    """An id derived from a request id (e.g. the last snapshot before a delete), always short
    enough for the column; as the system's, no request may send it (`SYSTEM_PURPOSES`)."""
    digest = hashlib.sha256(f"{purpose}\0{request_id}".encode()).hexdigest()
    return system_request_id(purpose, digest[:40])


def _digest(action: str, raw: Any) -> str:
    """A keyed digest (HMAC under SECRET_KEY) of the action and the input as submitted: it
    recognises a repeat, and the input may hold passwords, which a plain hash would let anyone
    who reads the table check guesses against."""
    try:
        text = json.dumps({"action": action, "input": raw}, sort_keys=True, default=str)
    except (ValueError, RecursionError):  # an int past Python's 4300 digits, deep nesting
        raise ValidationError(UNREADABLE) from None
    return salted_hmac("accounts.request-key", text, algorithm="sha256").hexdigest()


@dataclass(frozen=True)
class Claim:
    """A request id claimed in a scope: `earlier` is the key of an earlier request with the same
    id (what to return instead of acting again), None when this request is the first."""

    scope: str
    request_id: str
    earlier: RequestKey | None
    key: int | None = None  # the id of the row claimed (None with `earlier`)

    def bind(self, target: models.Model) -> None:
        """Record what this request made, for its repeats to return (in SQL, as the claim
        is: every create and action binds one)."""
        with connection.cursor() as cursor:
            cursor.execute(
                f"UPDATE {RequestKey._meta.db_table} SET target_type = %s, target_id = %s"  # noqa: S608 - our table name
                " WHERE scope = %s AND request_id = %s",
                [target._meta.label_lower, str(target.pk), self.scope, self.request_id],
            )

    def binding(self, target: models.Model) -> tuple[RequestKey, list[str]]:
        """What `bind` writes, as the claimed row and the fields to write, for a caller that
        writes it in a statement of its own with the rest of what the request made."""
        row = RequestKey(
            pk=self.key, scope=self.scope, request_id=self.request_id,
            target_type=target._meta.label_lower, target_id=str(target.pk),
        )  # fmt: skip
        return row, ["target_type", "target_id"]


def request_claim(*, scope: str, request_id: str, action: str, raw: Any) -> Claim:
    """Claim `request_id` in `scope` for this request.

    When the id is new, go on and `bind` what the request makes. When an earlier request used
    it with the same action and input, `earlier` names what that request made. Raises
    ValidationError when the id was used with another action or input. Call it inside the
    transaction that makes the object, after the permission check.
    """
    digest = _digest(action, raw)
    table = RequestKey._meta.db_table
    with connection.cursor() as cursor:
        # ON CONFLICT DO NOTHING waits for a concurrent insert of the same key to commit or
        # roll back: the second of two racing requests finds the first one's row.
        cursor.execute(
            f"INSERT INTO {table} (scope, request_id, action, digest, target_type, target_id,"  # noqa: S608 - our table name
            " created_at) VALUES (%s, %s, %s, %s, '', '', now())"
            " ON CONFLICT (scope, request_id) DO NOTHING RETURNING id",
            [scope, request_id, action, digest],
        )
        claimed = cursor.fetchone()
        if claimed is not None:
            return Claim(scope, request_id, None, claimed[0])
    earlier = RequestKey.objects.get(scope=scope, request_id=request_id)
    if earlier.digest != digest:
        raise ValidationError(REUSED)
    return Claim(scope, request_id, earlier)


def request_target(*, scope: str, request_id: str, action: str) -> tuple[str, str] | None:
    """What a request that used `request_id` in `scope` for `action` made, as (model label,
    primary key) as `Claim.bind` recorded it; None when no such request made anything (nor
    could have: an id `request_id_clean` refuses is never looked up)."""
    try:
        if not request_id or request_id_clean(request_id) != request_id:
            return None
    except ValidationError:
        return None
    made = (
        RequestKey.objects.filter(scope=scope, request_id=request_id, action=action)
        .exclude(target_type="")
        .values_list("target_type", "target_id")
        .first()
    )
    return None if made is None else (made[0], made[1])


def request_ids_prune(*, now: datetime | None = None, batch: int = 10_000) -> int:
    """Forget the request ids used more than `OPSDECK_REQUEST_IDS_KEPT_DAYS` ago (run daily by
    beat), a batch at a time so that no statement holds the table long; how many were forgotten.

    Only a repeat that late is affected, and it acts as a new request: a form kept open, or
    gone back to, for that long and sent again (Stripe keeps its idempotency keys 24 hours).
    """
    before = (now or timezone.now()) - timedelta(days=settings.OPSDECK_REQUEST_IDS_KEPT_DAYS)
    forgotten = 0
    while True:
        old = RequestKey.objects.filter(created_at__lt=before).order_by("created_at")
        batch_ids = list(old.values_list("pk", flat=True)[:batch])
        if not batch_ids:
            return forgotten
        forgotten += RequestKey.objects.filter(pk__in=batch_ids).delete()[0]
