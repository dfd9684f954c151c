"""What Opsdeck keeps of Stripe's objects: the catalog (meters, products, metered prices),
customers, and the values of subscriptions and invoices as Stripe holds them now."""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any, NamedTuple

from django.core.exceptions import ValidationError
from django.core.validators import URLValidator
from django.db import transaction
from django.db.models import Case, F, Q, Value, When
from django.utils import timezone

from accounts.audit import SYSTEM, Actor, audit_record
from accounts.errors import ActionDenied
from accounts.models import Tenant
from accounts.services import tenant_lock
from billing import meter_events
from billing.models import (
    DIMENSION_LABELS,
    BillingProfile,
    CreditNote,
    Invoice,
    InvoiceLine,
    MeterEvent,
    PastPrice,
    Plan,
    Price,
    StripeCustomer,
    StripeMeter,
    StripePrice,
    Subscription,
)
from billing.pricing import (
    MICRO,
    in_effect,
    minor_unit,
    stripe_hourly,
    stripe_unit_amount,
    unit_price_per_hour,
)
from billing.selectors import invoice_parties
from billing.stripe_gateway import (
    StripeFailure,
    StripeGateway,
    StripeRefused,
    StripeRetryable,
    gateway,
)

log = logging.getLogger(__name__)


# --- catalog -----------------------------------------------------------------------------------


EVENT_NAME_LENGTH = 100  # what Stripe's meters (and `StripeMeter.event_name`) take


def event_name_for(plan: Plan, dimension: str) -> str:
    """The event name of the plan's meter for `dimension`: `opsdeck_<plan key>_<dimension>`
    (dimensions have no underscore, so no two plans' names meet), or, for a plan key too long
    for that, its start and a digest of the whole key."""
    name = f"opsdeck_{plan.key}_{dimension}"
    if len(name) <= EVENT_NAME_LENGTH:
        return name
    digest = hashlib.sha256(plan.key.encode()).hexdigest()[:12]
    room = EVENT_NAME_LENGTH - len(f"opsdeck__{digest}_{dimension}")
    return f"opsdeck_{plan.key[:room]}_{digest}_{dimension}"


def lookup_key_for(price: Price | PastPrice) -> str:
    return f"opsdeck-{price.plan.key}-{price.dimension}"


def product_id_for(plan: Plan) -> str:
    return f"opsdeck-plan-{plan.key}"


def unit_amount_decimal(price: Price | PastPrice) -> Decimal:
    """What a Stripe metered price charges per meter unit (a millionth of a unit-hour), in the
    currency's minor unit, to Stripe's 12 decimal places (`pricing.stripe_unit_amount`)."""
    return stripe_unit_amount(unit_price_per_hour(price), price.currency)


def _decimal_text(amount: Decimal) -> str:
    return format(amount, "f")


@dataclass(frozen=True)
class Synced:
    """One catalog object: created or found, its kind, our key, Stripe's id."""

    action: str  # "created", "found"; "moved", "added", "removed" (a subscription item)
    kind: str  # "meter", "product", "price", "subscription item"
    key: str
    stripe_id: str

    def __str__(self) -> str:
        return f"{self.action} {self.kind} {self.key}: {self.stripe_id}"


def catalog_sync(gw: StripeGateway, *, out: Callable[[Synced], None] | None = None) -> list[Synced]:
    """Create what Stripe lacks of our catalog and store the ids: a product per plan, and per
    plan and priced dimension a meter and a metered monthly price on it, for the plan's prices
    (its newest) and for the prices a change keeps in effect until the next billing period.
    Existing objects are found (meters by event name, products by id, prices by lookup key), so
    running it again creates nothing. A price whose amount or meter changed is replaced, its
    lookup key moved over; then every subscription to the plan is put on the prices in effect
    in its current period (`subscription_align`)."""
    done: list[Synced] = []

    def note(item: Synced) -> None:
        done.append(item)
        if out:
            out(item)

    existing = {m.event_name: m.id for m in gw.meters() if m.status == "active"}
    plans = list(Plan.objects.prefetch_related("prices").order_by("key"))
    now = in_effect(plans, timezone.now())
    for plan in plans:
        prices = list(plan.prices.all())
        kept = [price for price in now[plan.pk].values() if isinstance(price, PastPrice)]
        if not prices and not kept:
            continue
        product_id = _product_sync(gw, plan, note)
        meters = {}
        for price in prices:
            meters[price.dimension] = _meter_sync(gw, plan, price.dimension, existing, note)
            _price_sync(gw, price, product_id, meters[price.dimension], note)
        for past in kept:
            meter_id = meters.get(past.dimension) or _meter_sync(
                gw, plan, past.dimension, existing, note
            )
            _kept_price_sync(gw, past, product_id, meter_id, note)
        subscriptions_align(gw, plan, note)
    _outbox_repoint()
    return done


def _outbox_repoint() -> int:
    """Point the meter events still waiting to be sent to a shared meter of an earlier version
    (no subscription bills those any more) at their plan's own; how many were."""
    shared = StripeMeter.objects.filter(plan__isnull=True).values_list("event_name", flat=True)
    repointed = 0
    for meter in StripeMeter.objects.filter(plan__isnull=False):
        repointed += MeterEvent.objects.filter(
            status__in=[MeterEvent.Status.PENDING, MeterEvent.Status.DEAD],  # dead: retried later
            event_name__in=list(shared),
            usage_record__plan_id=meter.plan_id,
            usage_record__dimension=meter.dimension,
        ).update(event_name=meter.event_name)
    if repointed:
        log.info("%s meter events waiting for a shared meter now go to their plan's", repointed)
    return repointed


def _meter_sync(
    gw: StripeGateway,
    plan: Plan,
    dimension: str,
    existing: dict[str, str],
    note: Callable[[Synced], None],
) -> str:
    """The id of the plan's meter for `dimension`, found by its event name or created."""
    event_name = event_name_for(plan, dimension)
    meter_id = existing.get(event_name)
    if meter_id:
        note(Synced("found", "meter", event_name, meter_id))
    else:
        meter_id = gw.meter_create(
            event_name=event_name, display_name=f"Opsdeck {plan.name}: {dimension}"
        ).id
        note(Synced("created", "meter", event_name, meter_id))
    StripeMeter.objects.update_or_create(
        plan=plan, dimension=dimension, defaults={"event_name": event_name, "meter_id": meter_id}
    )
    return meter_id


def _product_sync(gw: StripeGateway, plan: Plan, note: Callable[[Synced], None]) -> str:
    product_id = product_id_for(plan)
    if gw.product(product_id) is None:
        gw.product_create(product_id=product_id, name=plan.name, plan_key=plan.key)
        note(Synced("created", "product", plan.key, product_id))
    else:
        note(Synced("found", "product", plan.key, product_id))
    return product_id


def _price_sync(
    gw: StripeGateway,
    price: Price,
    product_id: str,
    meter_id: str,
    note: Callable[[Synced], None],
) -> None:
    lookup_key = lookup_key_for(price)
    amount = unit_amount_decimal(price)
    stripe_price_id, found = _metered_price_ensure(
        gw, price, lookup_key, product_id, meter_id, note
    )
    stored = StripePrice.objects.filter(price=price).first()
    earlier = [*stored.replaced_price_ids, stored.stripe_price_id] if stored else []
    replaced = [i for i in dict.fromkeys([*earlier, *([found.id] if found else [])])
                if i != stripe_price_id]  # fmt: skip
    StripePrice.objects.update_or_create(
        price=price,
        defaults={
            "stripe_product_id": product_id,
            "stripe_price_id": stripe_price_id,
            "lookup_key": lookup_key,
            "unit_amount_decimal": amount,
            "replaced_price_ids": replaced,
        },
    )


def _kept_price_sync(
    gw: StripeGateway,
    past: PastPrice,
    product_id: str,
    meter_id: str,
    note: Callable[[Synced], None],
) -> None:
    """Give a price a change keeps in effect (`past`) a Stripe price when it has none (the
    catalog was not synced between its change and the one before, or it never was): one of
    its own, found again by its lookup key (the dimension's, and when it ends)."""
    if past.stripe_price_id:  # kept with it when the price changed
        key = f"{lookup_key_for(past)} until {past.until:%Y-%m-%d %H:%M}"
        note(Synced("found", "price", key, past.stripe_price_id))
        return
    lookup_key = f"{lookup_key_for(past)}-until-{past.until:%Y%m%dT%H%MZ}"
    stripe_price_id, _ = _metered_price_ensure(gw, past, lookup_key, product_id, meter_id, note)
    PastPrice.objects.filter(pk=past.pk).update(stripe_price_id=stripe_price_id)


def _metered_price_ensure(
    gw: StripeGateway,
    price: Price | PastPrice,
    lookup_key: str,
    product_id: str,
    meter_id: str,
    note: Callable[[Synced], None],
) -> tuple[str, Any]:
    """The id of the Stripe price under `lookup_key` that charges `price` on `meter_id`: the
    one found there when it does, else a new one that takes the key over; and the price found
    under the key (None when there was none)."""
    amount = unit_amount_decimal(price)
    found = gw.price_by_lookup_key(lookup_key)
    if (
        found is not None
        and Decimal(found.unit_amount_decimal) == amount
        and found.currency == price.currency.lower()
        and found.recurring.meter == meter_id
    ):
        note(Synced("found", "price", lookup_key, found.id))
        return found.id, found
    created = gw.metered_price_create(
        lookup_key=lookup_key,
        product_id=product_id,
        meter_id=meter_id,
        currency=price.currency.lower(),
        unit_amount_decimal=_decimal_text(amount),
        nickname=f"{price.plan.name}: {DIMENSION_LABELS.get(price.dimension, price.dimension)}",
        replacing=found.id if found is not None else None,
    ).id
    note(Synced("created", "price", lookup_key, created))
    return created, found


def stripe_price_charging(price: Price) -> str:
    """The id of the Stripe price that charges `price` as it is, "" when none does (the
    catalog was not synced since it changed, or ever)."""
    stored = StripePrice.objects.filter(price=price).first()
    if stored is None or stored.unit_amount_decimal != unit_amount_decimal(price):
        return ""
    return stored.stripe_price_id


def stripe_prices_at(plan: Plan, at: datetime) -> dict[str, tuple[str, str]]:
    """The Stripe price of each of `plan`'s prices in effect at `at` (`pricing.in_effect`), by
    dimension: (its id, "" while none is known; and the key of the row it is stored on)."""
    stored = {p.price_id: p.stripe_price_id for p in StripePrice.objects.filter(price__plan=plan)}
    found = {}
    for dimension, price in in_effect([plan], at)[plan.pk].items():
        if isinstance(price, PastPrice):
            found[dimension] = (price.stripe_price_id, f"kept{price.pk}")
        else:
            found[dimension] = (stored.get(price.pk, ""), str(price.pk))
    return found


def subscriptions_align(gw: StripeGateway, plan: Plan, note: Callable[[Synced], None]) -> None:
    """Bring every Stripe subscription of ours to the plan that still bills (a cancelled one
    bills until its period ends) onto the prices in effect in its current period
    (`subscription_align`). One Stripe cannot give is logged and the rest goes on."""
    recent = timezone.now() - timedelta(days=32)  # longer ago, its period has ended
    held = (
        Subscription.objects.filter(plan=plan)
        .exclude(stripe_subscription_id="")
        .exclude(status=Subscription.Status.CANCELLED, cancelled_at__lt=recent)
        .values_list("stripe_subscription_id", flat=True)
    )
    for stripe_id in held:
        try:
            subscription = gw.subscription(stripe_id)
        except StripeFailure as exc:
            log.error("subscription %s not aligned: %s", stripe_id, exc)
            continue
        if subscription.status in _STRIPE_LIVE:
            subscription_align(gw, subscription, plan, note)


def subscription_align(
    gw: StripeGateway,
    subscription: Any,
    plan: Plan,
    note: Callable[[Synced], None] | None = None,
) -> None:
    """Put a Stripe subscription to `plan` on the Stripe prices of the plan's prices in effect
    when its current period began (`stripe_prices_at`). Stripe bills a metered item's whole
    period at the price the item holds when the period is invoiced, and a changed price applies
    from the start of a billing period (`services.plan_prices_replace`): so an item moves to a
    changed price once the subscription's period in which it applies has begun (its renewal's
    webhook, or the next sync after it), and Stripe charges each period what Opsdeck's invoices
    and cost reports price it at. An item on a dimension's other price (the item's meter says
    which dimension it bills) moves, a dimension no item bills gets an item, and an item on a
    dimension the plan does not price in the period is removed; a dimension whose price has no
    Stripe price yet is left as it is until the catalog sync makes one. A change Stripe does not
    take is logged and the rest goes on (the next sync or webhook tries it again)."""
    items = subscription["items"].data
    began = _moment(items[0].current_period_start) if items else None
    wanted = stripe_prices_at(plan, began or timezone.now())
    # Every meter of ours: the plan's own, and the shared ones of earlier versions.
    dimension_of = dict(StripeMeter.objects.values_list("meter_id", "dimension"))
    billed, changes = set(), []
    for item in items:
        recurring = _field(item.price, "recurring")
        dimension = dimension_of.get(_field(recurring, "meter") or "")
        if dimension is None:
            continue  # not a price of ours
        billed.add(dimension)
        if dimension not in wanted:
            changes.append(("removed", item.id, item.price.id, ""))  # not priced in the period
        elif wanted[dimension][0] and item.price.id != wanted[dimension][0]:
            changes.append(("moved", item.id, *wanted[dimension]))
    changes += [
        ("added", None, price_id, row)
        for dimension, (price_id, row) in wanted.items()
        if dimension not in billed and price_id
    ]
    for dimension, (price_id, _) in wanted.items():
        if not price_id:
            log.warning("subscription %s: the %s price of %s is not in Stripe's catalog yet",
                        subscription.id, dimension, plan.key)  # fmt: skip
    for action, item_id, price_id, row in changes:
        try:
            if action == "removed":
                gw.subscription_item_remove(subscription.id, item_id=item_id)
            elif action == "moved":
                gw.subscription_item_price_set(subscription.id, item_id=item_id, price_id=price_id)
            else:
                gw.subscription_item_add(subscription.id, price_id=price_id, for_=row)
        except StripeFailure as exc:
            log.error("subscription %s: %s %s failed: %s", subscription.id, action, price_id, exc)
            continue
        if note is not None:
            note(Synced(action, "subscription item", subscription.id, price_id))


# --- customers ---------------------------------------------------------------------------------


def customer_ensure(gw: StripeGateway, tenant: Tenant, *, email: str = "") -> StripeCustomer:
    """The tenant's Stripe customer, created once: two members paying at once (each with their
    own address) wait on the tenant's row while Stripe is asked, and the second finds the
    first's customer; a create sent again after a lost answer makes one (its idempotency key)."""
    existing = StripeCustomer.objects.filter(tenant=tenant).first()
    if existing:
        return existing
    with transaction.atomic():
        Tenant.objects.select_for_update().filter(pk=tenant.pk).first()
        existing = StripeCustomer.objects.filter(tenant=tenant).first()
        if existing:
            return existing
        customer = gw.customer_create(tenant_id=tenant.pk, name=tenant.name, email=email)
        # The name Stripe answers with: a retried create answers with the first one's.
        return customer_remember(
            tenant=tenant, customer_id=customer.id, name=_field(customer, "name") or ""
        )


def customer_remember(*, tenant: Tenant, customer_id: str, name: str = "") -> StripeCustomer:
    """Store the tenant's customer id (one per tenant: a second id is refused), and the name
    it holds (blank: not known; a tenant without billing details then has its name sent)."""
    with transaction.atomic():
        stored, _ = StripeCustomer.objects.get_or_create(
            tenant=tenant, defaults={"customer_id": customer_id, "name": name}
        )
    if stored.customer_id != customer_id:
        raise ValueError(f"{tenant} already has the Stripe customer {stored.customer_id}.")
    return stored


# --- billing details ---------------------------------------------------------------------------

# A push under way holds its claim this long (a few calls of at most `stripe_gateway.TIMEOUT`).
DETAILS_LEASE = timedelta(minutes=5)
DETAILS_BACKOFF_BASE = timedelta(seconds=30)
DETAILS_BACKOFF_CAP = timedelta(hours=1)


def _details_address(profile: BillingProfile) -> dict[str, str] | None:
    if not (profile.line1 or profile.country):
        return None
    return {
        "line1": profile.line1,
        "line2": profile.line2,
        "city": profile.city,
        "postal_code": profile.postal_code,
        "state": profile.state,
        "country": profile.country,
    }


class TaxIdRefused(StripeRefused):
    """Stripe took a billing profile's name, email and address, then refused its tax ID."""


class TaxIdUnreached(StripeRetryable):
    """Stripe took a billing profile's name, email and address, then could not be reached for
    its tax ID."""


def _tax_id_failure(exc: StripeFailure) -> StripeFailure:
    """`exc`, met at the tax ID once the rest of the details went: TaxIdRefused or
    TaxIdUnreached, as the profile says which part Stripe holds."""
    kind = TaxIdRefused if isinstance(exc, StripeRefused) else TaxIdUnreached
    return kind(str(exc), status=exc.status, code=exc.code, said=exc.said)


def _details_send(gw: StripeGateway, customer_id: str, profile: BillingProfile) -> None:
    """Put the customer's name, email, address and tax ID to the profile's: the tax ID is added
    before any other is removed, so a refused one (TaxIdRefused) leaves the one before in
    place."""
    key = f"opsdeck-details-{profile.tenant_id}-{profile.version}-{profile.stripe_attempts}"
    gw.customer_details_set(
        customer_id,
        name=profile.legal_name,
        email=profile.email,
        address=_details_address(profile),
        key=key,
    )
    wanted = (profile.tax_id_type, profile.tax_id_value) if profile.tax_id_type else None
    try:
        held = gw.customer_tax_ids(customer_id)
        kept = next((t for t in held if (t.type, t.value) == wanted), None)
        if wanted is not None and kept is None:
            kept = gw.customer_tax_id_create(
                customer_id, type_=wanted[0], value=wanted[1], key=f"{key}-tax-id"
            )
        for tax_id in held:
            if kept is None or tax_id.id != kept.id:
                gw.customer_tax_id_delete(customer_id, tax_id.id)
    except StripeFailure as exc:
        raise _tax_id_failure(exc) from exc


def _retry_at(exc: StripeFailure, attempts: int, now: datetime) -> datetime | None:
    """When beat tries a push again after its `attempts`-th failure in a row: later each time;
    never for one Stripe refused (it would again)."""
    if isinstance(exc, StripeRefused):
        return None
    return now + min(DETAILS_BACKOFF_BASE * 2 ** (attempts - 1), DETAILS_BACKOFF_CAP)


def billing_details_push(gw: StripeGateway, tenant_id: int, *, now: datetime | None = None) -> bool:
    """Bring the tenant's Stripe customer to its billing details when it does not hold them
    yet, or, for a tenant without billing details, to its name (`_name_push`); whether this
    call did. Nothing to do without a Stripe customer (the details go when one is made) or
    while another push holds the claim. Called outside any transaction.

    A failure (StripeFailure, raised after it is recorded on the profile) is tried again by
    beat (`billing_details_push_due`) with a growing delay; one Stripe refused waits for the
    details to change. Details changed while the push was under way stay due."""
    now = now or timezone.now()
    customer = StripeCustomer.objects.filter(tenant_id=tenant_id).first()
    if customer is None:
        return False
    claimed = (
        BillingProfile.objects.filter(tenant_id=tenant_id, stripe_version__lt=F("version"))
        .filter(Q(stripe_attempted_at=None) | Q(stripe_attempted_at__lt=now - DETAILS_LEASE))
        .update(stripe_attempted_at=now, stripe_attempts=F("stripe_attempts") + 1)
    )
    if not claimed:
        return _name_push(gw, customer, now)
    profile = BillingProfile.objects.get(tenant_id=tenant_id)
    try:
        _details_send(gw, customer.customer_id, profile)
    except StripeFailure as exc:
        log.error("billing details of tenant %s not sent to Stripe: %s", tenant_id, exc)
        retry = _retry_at(exc, profile.stripe_attempts, now)
        BillingProfile.objects.filter(pk=profile.pk).update(
            stripe_attempted_at=None,
            stripe_error=_unless_changed(profile, "stripe_error", exc.said),
            stripe_tax_id_behind=_unless_changed(
                profile, "stripe_tax_id_behind", isinstance(exc, TaxIdRefused | TaxIdUnreached)
            ),
            stripe_next_attempt_at=_unless_changed(profile, "stripe_next_attempt_at", retry),
        )
        raise
    BillingProfile.objects.filter(pk=profile.pk).update(
        stripe_attempted_at=None,
        stripe_version=profile.version,
        stripe_attempts=_unless_changed(profile, "stripe_attempts", 0),
        stripe_error=_unless_changed(profile, "stripe_error", ""),
        stripe_tax_id_behind=_unless_changed(profile, "stripe_tax_id_behind", False),
        stripe_next_attempt_at=_unless_changed(profile, "stripe_next_attempt_at", None),
    )
    return True


def _unless_changed(profile: BillingProfile, field: str, value: Any) -> Case:
    """`value` for the profile's `field`, unless its details changed since `profile` was read:
    then the push they are due stays as their saving set it."""
    return Case(
        When(version=profile.version, then=Value(value)),
        default=F(field),
        output_field=type(BillingProfile._meta.get_field(field))(),
    )


def _names_stale():
    """The Stripe customers of tenants without billing details whose name is not the tenant's."""
    return StripeCustomer.objects.filter(tenant__billing_profile__isnull=True).exclude(
        name=F("tenant__name")
    )


def _name_push(gw: StripeGateway, customer: StripeCustomer, now: datetime) -> bool:
    """Put the name of the customer of a tenant without billing details to the tenant's when
    it does not hold it (`StripeCustomer.name`); whether this call did. Claimed as a details
    push is; a failure is recorded on the customer and raised, and beat tries again."""
    claimed = (
        _names_stale()
        .filter(pk=customer.pk)
        .filter(Q(name_attempted_at=None) | Q(name_attempted_at__lt=now - DETAILS_LEASE))
        .update(name_attempted_at=now, name_attempts=F("name_attempts") + 1)
    )
    if not claimed:
        return False
    customer = StripeCustomer.objects.select_related("tenant").get(pk=customer.pk)
    name = customer.tenant.name
    key = f"opsdeck-name-{customer.tenant_id}-{now:%Y%m%dT%H%M%S%f}"  # one per claim
    try:
        gw.customer_name_set(customer.customer_id, name=name, key=key)
    except StripeFailure as exc:
        log.error("name of tenant %s not sent to Stripe: %s", customer.tenant_id, exc)
        StripeCustomer.objects.filter(pk=customer.pk).update(name_attempted_at=None)
        # Renamed meanwhile: the rename made its name due now, refused or not before.
        StripeCustomer.objects.filter(pk=customer.pk, tenant__name=name).update(
            name_error=exc.said, name_next_attempt_at=_retry_at(exc, customer.name_attempts, now)
        )
        raise
    StripeCustomer.objects.filter(pk=customer.pk).update(
        name=name,
        name_attempted_at=None,
        name_attempts=0,
        name_error="",
        name_next_attempt_at=None,
    )
    return True


def tenant_renamed(tenant: Tenant) -> None:
    """A tenant was renamed (called inside the renaming transaction): when it is billed under
    its name (no billing details), its Stripe customer takes the new one once the rename
    commits, by a worker; beat sends it when that fails or no worker is reached. A name Stripe
    refused before is tried again."""
    stale = StripeCustomer.objects.filter(tenant=tenant, tenant__billing_profile__isnull=True)
    if stale.update(name_attempts=0, name_error="", name_next_attempt_at=None):
        _push_on_commit(tenant.pk)


def _push_on_commit(tenant_id: int) -> None:
    """Have a worker push the tenant's details (or name) once the transaction commits."""

    def push() -> None:
        from billing.tasks import billing_details_push  # tasks import this module

        billing_details_push.delay(tenant_id)

    transaction.on_commit(push, robust=True)  # a broker out of reach: beat sends it


def billing_details_retry(*, actor: Actor, tenant: Tenant) -> None:
    """Staff send Stripe the tenant's billing details (its name, while it has none) again now,
    whatever became of the tries before (one Stripe refused too: the cause may be fixed in
    Stripe meanwhile); audited. A worker pushes them once committed, beat when none is
    reached. A ValidationError, nothing changed, when Stripe holds them already or the tenant
    has no Stripe customer (they go when one is made)."""
    with transaction.atomic():
        customer = StripeCustomer.objects.select_for_update().filter(tenant=tenant).first()
        if customer is None:
            raise ValidationError(
                f"{tenant.name} has no Stripe customer yet: its details go when one is made."
            )
        profile = BillingProfile.objects.select_for_update().filter(tenant=tenant).first()
        if profile is not None:
            if not profile.stripe_pending:
                raise ValidationError(f"Stripe already holds the billing details of {tenant.name}.")
            # Its attempts still count: they name the next one's idempotency key, and Stripe
            # answers a key it refused again with the same refusal.
            BillingProfile.objects.filter(pk=profile.pk).update(
                stripe_error="", stripe_tax_id_behind=False, stripe_next_attempt_at=timezone.now()
            )
            payload = {"version": profile.version, "last_error": profile.stripe_error}
        else:
            if customer.name == tenant.name:
                raise ValidationError(f"Stripe already holds the name of {tenant.name}.")
            StripeCustomer.objects.filter(pk=customer.pk).update(
                name_attempts=0, name_error="", name_next_attempt_at=None
            )
            payload = {"name": tenant.name, "last_error": customer.name_error}
        audit_record(
            actor=actor,
            action="billing.details_retry",
            tenant=tenant,
            target=profile or customer,
            payload=payload,
        )
        _push_on_commit(tenant.pk)


def billing_details_push_due(*, now: datetime | None = None) -> int:
    """Push the billing details due to Stripe (run every minute by beat): saved while Stripe
    could not be told, or since a customer was made for the tenant; and the names of the
    tenants billed under their name that their customer does not hold (renamed, or made by a
    checkout), unless Stripe refused it. How many went; a failure is logged and recorded, and
    the others still go."""
    gw = gateway()
    if gw is None:
        return 0
    now = now or timezone.now()
    due = BillingProfile.objects.filter(
        stripe_version__lt=F("version"),
        stripe_next_attempt_at__lte=now,
        tenant__stripe_customer__isnull=False,
    ).values_list("tenant_id", flat=True)
    names_due = _names_stale().filter(
        Q(name_next_attempt_at__lte=now) | Q(name_next_attempt_at=None, name_error="")
    )
    pushed = 0
    for tenant_id in [*due, *names_due.values_list("tenant_id", flat=True)]:
        try:
            pushed += billing_details_push(gw, tenant_id, now=now)
        except StripeFailure:
            continue  # recorded; beat tries it again
    return pushed


# --- subscriptions and invoices, as Stripe holds them now --------------------------------------

# Stripe's subscription statuses in ours (pending, active, past_due, suspended, cancelled).
SUBSCRIPTION_STATUSES = {
    "incomplete": "pending",
    "trialing": "active",
    "active": "active",
    "past_due": "past_due",
    "unpaid": "past_due",
    "paused": "suspended",
    "canceled": "cancelled",
    "incomplete_expired": "cancelled",
}


def subscription_status_next(current: str | None, stripe_status: str) -> str:
    """The status to store: Stripe's, except that a cancelled subscription stays cancelled
    (an event about its earlier life may arrive late)."""
    if current == "cancelled":
        return current
    return SUBSCRIPTION_STATUSES.get(stripe_status, "pending")


def _moment(epoch: int | None) -> datetime | None:
    return datetime.fromtimestamp(epoch, UTC) if epoch else None


def _field(obj: Any, name: str) -> Any:
    """A field of a Stripe object, None when absent (SDK objects are not dicts)."""
    return getattr(obj, name, None)


def stripe_id(obj: Any, name: str) -> str:
    """The id a field of a Stripe object names ("" when none), expanded into an object or not."""
    value = _field(obj, name)
    return str(
        _field(value, "id") if value is not None and not isinstance(value, str) else value or ""
    )


def subscription_values(subscription: Any) -> dict[str, Any]:
    """What Opsdeck keeps of a Stripe subscription (its period lives on its items)."""
    items = subscription["items"].data if _field(subscription, "items") else []
    return {
        "stripe_subscription_id": subscription.id,
        "stripe_customer_id": subscription.customer,
        "stripe_status": subscription.status,
        "status": SUBSCRIPTION_STATUSES.get(subscription.status, "pending"),
        "current_period_start": _moment(items[0].current_period_start if items else None),
        "current_period_end": _moment(items[0].current_period_end if items else None),
        "started_at": _moment(_field(subscription, "start_date")),
        "cancel_at_period_end": bool(_field(subscription, "cancel_at_period_end")),
        "price_ids": [item.price.id for item in items],
    }


def invoice_values(invoice: Any) -> dict[str, Any]:
    """What Opsdeck keeps of a Stripe invoice (its subscription is under `parent`)."""
    details = _field(_field(invoice, "parent"), "subscription_details")
    return {
        "stripe_invoice_id": invoice.id,
        "stripe_customer_id": invoice.customer,
        "stripe_subscription_id": _field(details, "subscription"),
        "status": invoice.status,
        "number": _field(invoice, "number"),
        "currency": invoice.currency,
        "amount_due": _field(invoice, "amount_due"),
        "amount_paid": _field(invoice, "amount_paid"),
        "hosted_invoice_url": _field(invoice, "hosted_invoice_url"),
        "period_start": _moment(_field(invoice, "period_start")),
        "period_end": _moment(_field(invoice, "period_end")),
    }


class CatalogMissing(Exception):
    """A plan whose prices are not in Stripe yet (`manage.py stripe_sync_catalog`)."""


def checkout_start(
    gw: StripeGateway, subscription: Subscription, *, success_url: str, cancel_url: str,
    email: str = "",
) -> str | None:  # fmt: skip
    """The address of a Stripe Checkout page that subscribes the tenant's customer (made
    once) to the plan's metered prices; the webhook activates our subscription once it is
    paid for. Asking again for the same subscription gives the same page while it is open:
    two pages open for one subscription could both be paid. None once the subscription no
    longer waits for payment."""
    # This month's prices: one coming at the next billing period reaches the subscription at
    # its renewal (`subscription_align`).
    price_ids = [
        price_id for price_id, _ in stripe_prices_at(subscription.plan, timezone.now()).values()
    ]
    if not price_ids or not all(price_ids):
        raise CatalogMissing(
            f"The {subscription.plan.name} plan is not in Stripe's catalog yet "
            "(manage.py stripe_sync_catalog)."
        )
    customer = customer_ensure(gw, subscription.tenant, email=email)
    with transaction.atomic():
        # Locked while Stripe is asked: two requests at once (from two addresses, whose pages
        # differ) make one page; a cancel or a resume meanwhile makes none.
        locked = Subscription.objects.select_for_update().get(pk=subscription.pk)
        if locked.status != Subscription.Status.PENDING or locked.stripe_subscription_id:
            return None
        Subscription.objects.filter(pk=locked.pk).update(stripe_customer_id=customer.customer_id)
        session = gw.checkout_session_open(
            customer_id=customer.customer_id, subscription_id=locked.pk
        )
        # A page made before the prices changed is not offered again.
        asked = session.metadata.to_dict().get("opsdeck_prices") if session is not None else None
        if session is not None and asked != " ".join(price_ids):
            gw.checkout_session_expire(session.id)
            session = None
        if session is None:
            # None open: none made yet, or the one before expired (or was closed above).
            session = gw.checkout_session_create(
                subscription_id=locked.pk,
                page=locked.checkout_pages,
                customer_id=customer.customer_id,
                tenant_id=locked.tenant_id,
                price_ids=price_ids,
                success_url=success_url,
                cancel_url=cancel_url,
            )
            Subscription.objects.filter(pk=locked.pk).update(checkout_pages=F("checkout_pages") + 1)
    return session.url


def subscription_resume(
    gw: StripeGateway, subscription: Subscription, *, actor: Actor
) -> Subscription | None:
    """For a subscription waiting for payment, the Stripe subscription of the tenant's last
    cancelled one to the plan, when Stripe still bills it (cancelled, then subscribed again
    within the period): it goes on (Stripe is told to keep it) and ours takes it over, active
    at once (`subscription_mirror`), rather than a second Stripe subscription billing the
    plan's usage beside it. One Stripe already keeps going (an earlier attempt kept it and
    failed before the hand-over) is taken over the same way. Ours, as it is now, when it no
    longer waits (another request resumed it meanwhile); None when there is nothing to resume:
    pay on Checkout. A ValidationError, nothing changed, while that subscription owes an
    invoice: paid first, it can go on."""
    with transaction.atomic():
        # Locked: two requests at once resume it once.
        ours = Subscription.objects.select_for_update().get(pk=subscription.pk)
        if ours.status != Subscription.Status.PENDING or ours.stripe_subscription_id:
            return ours
        earlier = _cancelled_last(ours.tenant_id, ours.plan_id, lock=True)
        held = _stripe_held(gw, earlier) if earlier is not None else None
        if held is None:
            return None
        _owing_refuse(held, ours.plan)
        if SUBSCRIPTION_STATUSES.get(held.status) != Subscription.Status.ACTIVE:
            return None  # ended in Stripe: a new one starts on Checkout
        if held.cancel_at_period_end:
            gw.subscription_keep(held.id, for_=ours.pk)
        # One of ours per Stripe subscription: its webhooks and invoices go to the new one.
        Subscription.objects.filter(pk=earlier.pk).update(stripe_subscription_id="")
        Subscription.objects.filter(pk=ours.pk).update(
            stripe_subscription_id=held.id, stripe_customer_id=held.customer
        )
        audit_record(
            actor=actor,
            action="subscription.stripe_resume",
            tenant=ours.tenant,
            target=ours,
            payload={"stripe_subscription": held.id, "cancelled_subscription": earlier.pk},
        )
        return subscription_mirror(gw.subscription(held.id), gw)


def _cancelled_last(tenant_id: int, plan_id: int, *, lock: bool = False) -> Subscription | None:
    """The tenant's subscription to the plan cancelled last that Stripe billed."""
    rows = Subscription.objects.select_for_update() if lock else Subscription.objects
    return (
        rows.filter(tenant_id=tenant_id, plan_id=plan_id, status=Subscription.Status.CANCELLED)
        .exclude(stripe_subscription_id="")
        .order_by("-cancelled_at", "-pk")
        .first()
    )


def _owing_refuse(held: Any, plan: Plan) -> None:
    """A ValidationError when the Stripe subscription `held` owes an invoice."""
    if SUBSCRIPTION_STATUSES.get(held.status) == Subscription.Status.PAST_DUE:
        raise ValidationError(
            f"Your cancelled {plan.name} subscription still has an unpaid invoice on "
            "Stripe: pay it (Manage payment method), then subscribe again."
        )


def subscribe_check(gw: StripeGateway, tenant: Tenant, plan: Plan) -> None:
    """Before a new subscription to `plan` is made: a ValidationError while the tenant's
    cancelled one still owes Stripe an invoice (paid, that one goes on instead)."""
    earlier = _cancelled_last(tenant.pk, plan.pk)
    held = _stripe_held(gw, earlier) if earlier is not None else None
    if held is not None:
        _owing_refuse(held, plan)


def _stripe_held(gw: StripeGateway, subscription: Subscription) -> Any | None:
    """The Stripe subscription ours holds, None when Stripe no longer has it (it owes nothing
    and bills nothing: another Stripe account's, or one deleted with its customer)."""
    try:
        return gw.subscription(subscription.stripe_subscription_id)
    except StripeRefused as exc:
        if exc.status == 404:
            return None
        raise


_KEY = re.compile(r"[0-9]{1,18}")


def _key(reference: Any) -> int | None:
    """One of our row ids as our checkout wrote it into a Stripe object (plain digits); None
    for anything else a Stripe object holds there."""
    text = str(reference or "")
    return int(text) if _KEY.fullmatch(text) else None


def _ours(stripe_subscription: Any) -> Subscription | None:
    """Our subscription for a Stripe one: by its id, else by the id our checkout put in its
    metadata (then the ids are stored), provided the customer is the tenant's."""
    found = Subscription.objects.filter(stripe_subscription_id=stripe_subscription.id).first()
    if found is not None:
        return found
    reference = _key(_field(_field(stripe_subscription, "metadata"), "opsdeck_subscription"))
    if reference is None:
        return None
    found = Subscription.objects.filter(
        pk=reference, tenant__stripe_customer__customer_id=stripe_subscription.customer
    ).first()
    # The ids are stored when ours has none yet and still waits for one: a Stripe subscription
    # started later for it (a second checkout page paid) never replaces the one it holds. Judged
    # by the UPDATE itself, on the row as it is once a cancel holding it has committed: a cancel
    # that found no Stripe subscription to end leaves this one unheld, so it is ended.
    if found is not None and not found.stripe_subscription_id:
        Subscription.objects.filter(pk=found.pk, stripe_subscription_id="").exclude(
            status=Subscription.Status.CANCELLED
        ).update(
            stripe_subscription_id=stripe_subscription.id,
            stripe_customer_id=stripe_subscription.customer,
        )
        found.refresh_from_db()
    return found


# Which service moves our subscription to the status Stripe reports, from where it is.
_MOVES = {
    ("pending", "active"): "approve",
    ("active", "past_due"): "mark_past_due",
    ("past_due", "active"): "reactivate",
    ("suspended", "active"): "reactivate",
    ("active", "suspended"): "suspend",
    ("past_due", "suspended"): "suspend",
}


# Stripe's statuses of a subscription that bills (or will).
_STRIPE_LIVE = frozenset({"active", "trialing", "past_due", "unpaid", "incomplete"})


def subscription_mirror(subscription: Any, gw: StripeGateway) -> Subscription | None:
    """Bring our subscription to what Stripe holds now (`subscription` is freshly fetched,
    never an event's copy; its period and status are read again once ours is locked): its
    period, and its status through the same services staff use (audited, mailed), as the
    system. A cancelled one stays cancelled; a Stripe subscription we did not start is logged
    and left alone.

    A Stripe subscription that is not the one ours holds — a checkout paid after ours was
    cancelled (its page was still open), or a second page paid — would bill the tenant's usage
    again: it is ended in Stripe at once, and ours is left as it is. (The one ours holds, when
    ours is cancelled, was told to end with its period, and bills until then.)"""
    ours = _ours(subscription)
    if ours is None:
        log.warning("stripe subscription %s is not one of ours", subscription.id)
        return None
    if ours.stripe_subscription_id != subscription.id:
        if subscription.status in _STRIPE_LIVE:
            log.warning(
                "stripe subscription %s is not the one ours (%s) holds: ending it",
                subscription.id, ours.pk,
            )  # fmt: skip
            gw.subscription_cancel_now(
                subscription.id, why="A second subscription for one Opsdeck subscription."
            )
        return ours
    if subscription.status in _STRIPE_LIVE:
        # Started from a page made before a price changed, or on a plan that added a price.
        subscription_align(gw, subscription, ours.plan)
    with transaction.atomic():
        # The organization first, as every change of a subscription locks them (a billing
        # manager's cancel; a suspension, which the mirror may make): the other order
        # deadlocks with such a change.
        tenant_lock(ours.tenant_id)
        # Judged on ours as it is under its lock: a cancel committing meanwhile is not undone
        # (nor refused in the audit log as a reactivation nobody asked for).
        ours = Subscription.objects.select_for_update().get(pk=ours.pk)
        # And on Stripe's subscription as it is under that lock, read again: events about it
        # are handled side by side and its objects carry no version, so a copy read before
        # (a declined renewal's) may be older than one another worker applied since (the
        # payment's). Serialized on our row, the copy applied last is the newest.
        current = subscription_values(gw.subscription(subscription.id))
        Subscription.objects.filter(pk=ours.pk).update(
            current_period_start=current["current_period_start"],
            current_period_end=current["current_period_end"],
            stripe_started_at=current["started_at"],
        )
        ours.refresh_from_db()
        return _status_mirror(ours, subscription.id, current["stripe_status"])


def subscriptions_reconcile() -> int:
    """Bring each subscription Stripe bills to what Stripe holds now (run hourly by beat); how
    many Stripe answered for. Stripe's own webhook says so at once, but one lost, or given up
    on after Stripe's three days of retries, left ours active for good after Stripe ended it:
    its usage went on being sent to meters no subscription bills, and no invoice held it. A
    Stripe subscription gone (its customer deleted) ends ours as an ended one does. Stripe out
    of reach ends the round; the next one reads them all again."""
    gw = gateway()
    if gw is None:
        return 0
    open_ = (
        Subscription.objects.exclude(stripe_subscription_id="")
        .exclude(status=Subscription.Status.CANCELLED)
        .values_list("pk", "stripe_subscription_id")
    )
    answered = 0
    for pk, stripe_id in list(open_):
        try:
            held = gw.subscription(stripe_id)
        except StripeRefused as exc:
            if not exc.gone:
                log.error("subscription %s: Stripe refused to read %s: %s", pk, stripe_id, exc)
                continue
            held = None
        except StripeFailure as exc:
            log.warning("subscriptions not reconciled with Stripe: %s", exc)
            break
        answered += 1
        if held is not None:
            subscription_mirror(held, gw)
            continue
        with transaction.atomic():
            tenant_lock(Subscription.objects.values_list("tenant_id", flat=True).get(pk=pk))
            ours = Subscription.objects.select_for_update().get(pk=pk)
            if ours.stripe_subscription_id == stripe_id:
                _status_mirror(ours, stripe_id, "canceled")
    return answered


def _status_mirror(ours: Subscription, stripe_id: str, stripe_status: str) -> Subscription:
    """Move ours (locked) to the status Stripe's `stripe_status` means for it."""
    from billing import services  # services import this module

    wanted = subscription_status_next(ours.status, stripe_status)
    if wanted == ours.status:
        return ours
    if wanted == "cancelled":
        # Stripe ended it: ours ends too (instances keep running; new ones are refused), and
        # the usage it had not been sent yet is billed on Opsdeck's invoice instead.
        cancelled = services.subscription_cancel(
            actor=SYSTEM, subscription=ours, instances_may_run=True
        )
        meter_events.unsent_to_local(tenant_id=ours.tenant_id, plan_id=ours.plan_id)
        return cancelled
    move = _MOVES.get((ours.status, wanted))
    if move is None:
        log.warning("stripe subscription %s: no move from %s to %s", stripe_id,
                    ours.status, wanted)  # fmt: skip
        return ours
    if move == "suspend":
        return services.subscription_suspend(
            actor=SYSTEM, subscription=ours, reason="paused in Stripe"
        )
    try:
        return getattr(services, f"subscription_{move}")(actor=SYSTEM, subscription=ours)
    except ActionDenied as exc:
        if move != "reactivate":
            raise
        log.info(
            "subscription %s: kept suspended: %s", ours.pk, exc
        )  # by staff, until they lift it
        return ours


# Stripe's invoice statuses in ours; an uncollectible invoice stays finalized and unpaid.
INVOICE_STATUSES = {
    "draft": "draft",
    "open": "open",
    "paid": "paid",
    "uncollectible": "open",
    "void": "void",
}
# How far along each status is: a mirror never moves an invoice back (two deliveries fetched
# at different moments may store in either order).
_INVOICE_PROGRESS = {"draft": 0, "open": 1, "paid": 2, "void": 2}


# What the invoice's URL fields hold (their max_length): an absolute http(s) address.
_LINK = URLValidator(schemes=["http", "https"])


def link_safe(url: Any) -> str:
    """`url` if it is an absolute http(s) address, else "": what Stripe sends is shown as a
    link, and a link must never run script."""
    if not isinstance(url, str) or len(url) > 1000:
        return ""
    try:
        _LINK(url)
    except ValidationError:
        return ""
    return url


def _money(minor_units: Any, currency: str) -> Decimal:
    """An amount Stripe gives in the currency's minor unit, in the currency."""
    return Decimal(int(minor_units or 0)) * minor_unit(currency)


class Billed(NamedTuple):
    """What a Stripe price of ours bills: a dimension, in a unit."""

    dimension: str
    unit: str


def stripe_prices_known() -> dict[str, Billed]:
    """Every Stripe price of ours, by id: those of the plans' prices (and those they replaced),
    and those of prices a change kept (a dimension a plan no longer prices, too)."""
    known = {
        price_id: Billed(p.price.dimension, p.price.unit)
        for p in StripePrice.objects.select_related("price")
        for price_id in [p.stripe_price_id, *p.replaced_price_ids]
    }
    kept = PastPrice.objects.exclude(stripe_price_id="").order_by("-until")
    for past in kept.select_related("plan").prefetch_related("plan__prices"):
        units = {price.dimension: price.unit for price in past.plan.prices.all()}
        unit = past.unit or units.get(past.dimension, "")
        known.setdefault(past.stripe_price_id, Billed(past.dimension, unit))
    return known


def invoice_line_values(line: Any, currency: str, prices: dict[str, Billed]) -> dict:
    """One Stripe invoice line as ours: the dimension and unit of the price it bills
    (`stripe_prices_known`), the unit-hours (Stripe counts millionths of one), the price of a
    unit-hour and the amount."""
    details = _field(_field(line, "pricing"), "price_details")
    ours = prices.get(str(_field(details, "price") or ""))
    quantity = Decimal(str(_field(line, "quantity_decimal") or _field(line, "quantity") or 0))
    unit_amount = Decimal(str(_field(_field(line, "pricing"), "unit_amount_decimal") or 0))
    if ours is None:  # a line Opsdeck did not price (e.g. added in Stripe's dashboard)
        return {
            "dimension": "other",
            "unit": "",
            "instance_name": str(_field(line, "description") or "")[:100],
            "quantity": quantity,
            "unit_price": unit_amount * minor_unit(currency),
            "amount": _money(line.amount, currency),
        }
    return {
        "dimension": ours.dimension,
        "unit": ours.unit,
        "instance_name": "",
        "quantity": (quantity / MICRO).quantize(Decimal("1e-6")),
        "unit_price": stripe_hourly(unit_amount, currency).quantize(Decimal("1e-12")),
        "amount": _money(line.amount, currency),
    }


def invoice_adjustments(
    invoice: Any, rows: list[dict], total: Decimal, currency: str
) -> tuple[Decimal, Decimal]:
    """What Stripe took off the invoice's lines (`rows`, as ours) and added to them, so that
    its page's figures add up to its `total`: the discounts its coupons gave
    (`total_discount_amounts`), and what remains between the discounted lines and the total,
    a tax not included in their amounts (an included one is in them already)."""
    if not rows:  # nothing for them to add up to
        return Decimal(0), Decimal(0)
    given = _field(invoice, "total_discount_amounts") or []
    discount = sum((_money(each["amount"], currency) for each in given), Decimal(0))
    lines = sum((row["amount"] for row in rows), Decimal(0))
    return discount, total - (lines - discount)


def invoice_mirror(invoice: Any, lines: list[Any]) -> Invoice | None:
    """Bring our copy of a Stripe invoice to what Stripe holds now (`invoice` and its `lines`
    freshly fetched): number, status, total, period, lines, and the hosted page and PDF
    addresses. Stored once per Stripe id; its lines follow Stripe's while it is a draft, and
    once finalized only its status moves on (the database refuses anything else). An invoice
    of a subscription we did not start is logged and left alone."""
    values = invoice_values(invoice)
    subscription = (
        Subscription.objects.filter(stripe_subscription_id=values["stripe_subscription_id"])
        .select_related("tenant", "plan")
        .first()
        if values["stripe_subscription_id"]
        else None
    )
    if subscription is None:
        log.warning("stripe invoice %s is not of one of our subscriptions", invoice.id)
        return None
    status = INVOICE_STATUSES.get(values["status"], "draft")
    currency = values["currency"]
    transitions = _field(invoice, "status_transitions")
    period_start = values["period_start"] or _moment(_field(invoice, "created"))
    # Made once whichever delivery comes first (the unique id settles a race), then locked:
    # concurrent deliveries about one invoice apply one after the other.
    Invoice.objects.get_or_create(
        stripe_invoice_id=invoice.id,
        defaults={
            "tenant": subscription.tenant,
            "plan": subscription.plan,
            "period": f"{period_start:%Y-%m}",
            "source": Invoice.Source.STRIPE,
            "currency": currency,
        },
    )
    with transaction.atomic():
        stored = Invoice.objects.select_for_update().get(stripe_invoice_id=invoice.id)
        if _INVOICE_PROGRESS[status] < _INVOICE_PROGRESS[stored.status]:
            return stored  # an older copy: what we hold is newer
        fields: dict[str, Any] = {
            "status": status,
            "hosted_invoice_url": link_safe(values["hosted_invoice_url"]),
            "pdf_url": link_safe(_field(invoice, "invoice_pdf")),
            "paid_at": _moment(_field(transitions, "paid_at")),
            "voided_at": _moment(_field(transitions, "voided_at")),
        }
        if stored.status == Invoice.Status.DRAFT:
            prices = stripe_prices_known()
            # Finalized now: made out to the tenant's details as they are, frozen from here.
            billed_to, issuer = invoice_parties(stored) if status != "draft" else (None, "")
            rows = [invoice_line_values(line, currency, prices) for line in lines]
            total = _money(_field(invoice, "total"), currency)
            discount, tax = invoice_adjustments(invoice, rows, total, currency)
            Invoice.objects.filter(pk=stored.pk).update(
                number=values["number"] or None,
                currency=currency,
                total=total,
                discount=discount,
                tax=tax,
                finalized_at=_moment(_field(transitions, "finalized_at")),
                billed_to=billed_to,
                issuer=issuer,
            )
            stored.lines.all().delete()
            InvoiceLine.objects.bulk_create(InvoiceLine(invoice=stored, **row) for row in rows)
        Invoice.objects.filter(pk=stored.pk).update(**fields)
        if status != stored.status:
            audit_record(
                actor=SYSTEM,
                action=f"invoice.stripe_{status}",
                tenant=subscription.tenant,
                target=stored,
                payload={"stripe_invoice": invoice.id, "number": values["number"] or ""},
            )
    stored.refresh_from_db()
    return stored


def invoice_draft_deleted(stripe_invoice_id: str) -> None:
    """Forget our copy of a Stripe draft deleted in Stripe: it kept the organization from being
    deleted ("its invoice is being prepared") for ever."""
    with transaction.atomic():
        draft = (
            Invoice.objects.select_for_update()
            .select_related("tenant")
            .filter(stripe_invoice_id=stripe_invoice_id, status=Invoice.Status.DRAFT)
            .first()
        )
        if draft is None:
            return
        audit_record(
            actor=SYSTEM,
            action="invoice.stripe_deleted",
            tenant=draft.tenant,
            target=draft,
            payload={"stripe_invoice": stripe_invoice_id, "period": draft.period},
        )
        draft.delete()


def credit_note_mirror(invoice: Invoice, credit_note_id: str, gw: StripeGateway) -> CreditNote:
    """Bring our copy of a Stripe credit note of `invoice` (ours, mirrored) to what Stripe
    holds now, read again once the invoice is locked (concurrent deliveries about it apply one
    after the other, the last reading the newest), and what the invoice's credit notes take
    off it. A void one stays void (Stripe never issues it again)."""
    with transaction.atomic():
        stored = Invoice.objects.select_for_update().get(pk=invoice.pk)
        held = gw.credit_note(credit_note_id)
        if stripe_id(held, "invoice") != stored.stripe_invoice_id:
            raise ValueError(f"credit note {credit_note_id} is not of {stored.stripe_invoice_id}")
        currency = held.currency
        values = {
            "number": str(_field(held, "number") or "")[:64],
            "status": CreditNote.Status.VOID if held.status == "void" else CreditNote.Status.ISSUED,
            "currency": currency,
            "amount": _money(_field(held, "total"), currency),
            "refunded": _money(_note_refunded(held), currency),
            "reason": CreditNote.REASONS.get(str(_field(held, "reason") or ""), ""),
            "memo": str(_field(held, "memo") or "")[:2000],
            "pdf_url": link_safe(_field(held, "pdf")),
            "created": _moment(_field(held, "created")) or timezone.now(),
            "voided_at": _moment(_field(held, "voided_at")),
        }
        found = CreditNote.objects.filter(stripe_credit_note_id=held.id).first()
        if found is not None and found.status == CreditNote.Status.VOID:
            values.update(status=found.status, voided_at=found.voided_at)
        note, _ = CreditNote.objects.update_or_create(
            stripe_credit_note_id=held.id, defaults={"invoice": stored, **values}
        )
        if found is None or found.status != note.status:
            audit_record(
                actor=SYSTEM,
                action=f"invoice.stripe_credit_note_{note.status}",
                tenant=stored.tenant,
                target=stored,
                payload={
                    "stripe_credit_note": held.id,
                    "number": note.number,
                    "amount": str(note.amount),
                },
            )
        invoice_credits_total(stored)
    return note


def charge_refunds_mirror(
    invoice: Invoice, charge_id: str, gw: StripeGateway, *, paid: list[tuple[str, int]]
) -> Invoice:
    """Bring what the charge `charge_id` that paid `invoice` (ours, mirrored) has refunded of
    it to what Stripe holds now, read again once the invoice is locked; a refund is never
    undone, so an older copy never lowers it. `paid`: what the charge's payment paid of each
    invoice it paid, in the order Stripe lists their payments (`invoices_paid_by`); the
    invoice's part is `charge_refund_parts`'."""
    with transaction.atomic():
        stored = Invoice.objects.select_for_update().get(pk=invoice.pk)
        held = gw.charge(charge_id)
        # Read after the charge: each refund its amount counts is among them, and the credit
        # note that made it (the two are made at once) among the credit notes.
        made = {refund.id for refund in gw.charge_refunds(held.id)}
        noted = []
        for invoice_id, amount in paid:
            notes = gw.credit_notes(invoice_id)
            noted.append(
                (
                    invoice_id,
                    amount,
                    credit_notes_refunded(notes, made),
                    credit_notes_credited(notes),
                )
            )
        # What was counted of the charge on each of ours stays counted there.
        counted = {
            row.stripe_invoice_id: int(row.charge_refunds.get(held.id, 0))
            for row in Invoice.objects.filter(stripe_invoice_id__in=[each for each, _ in paid])
        }
        parts = charge_refund_parts(int(_field(held, "amount_refunded") or 0), noted, counted)
        refunds = dict(stored.charge_refunds)
        before = int(refunds.get(held.id, 0))
        refunds[held.id] = max(before, parts.get(stored.stripe_invoice_id, 0))
        if refunds[held.id] != before:
            Invoice.objects.filter(pk=stored.pk).update(charge_refunds=refunds)
            audit_record(
                actor=SYSTEM,
                action="invoice.stripe_refunded",
                tenant=stored.tenant,
                target=stored,
                payload={
                    "stripe_charge": held.id,
                    "refunded": str(_money(refunds[held.id], held.currency)),
                },
            )
            stored.charge_refunds = refunds
        invoice_credits_total(stored)
    stored.refresh_from_db()
    return stored


def credit_notes_refunded(credit_notes: list[Any], refund_ids: set[str]) -> int:
    """What the refunds `refund_ids` (a charge's) gave back for `credit_notes` (an invoice's,
    voided ones too: voiding one undoes no refund), in the currency's minor unit."""
    return sum(_note_refunded(note, refund_ids) for note in credit_notes)


def credit_notes_credited(credit_notes: list[Any]) -> int:
    """What the issued ones of `credit_notes` (an invoice's) gave back of it once paid other
    than by refunds (to the customer's balance, outside Stripe), in the currency's minor unit."""
    return sum(
        max(0, int(_field(note, "post_payment_amount") or 0) - _note_refunded(note))
        for note in credit_notes
        if _field(note, "status") != "void"
    )


def _note_refunded(note: Any, refund_ids: set[str] | None = None) -> int:
    """What a Stripe credit note's refunds (of them, those in `refund_ids` when given) gave
    back, in the currency's minor unit."""
    return sum(
        int(_field(refund, "amount_refunded") or 0)
        for refund in _field(note, "refunds") or []
        if refund_ids is None or stripe_id(refund, "refund") in refund_ids
    )


def charge_refund_parts(
    refunded: int, paid: list[tuple[str, int, int, int]], counted: dict[str, int]
) -> dict[str, int]:
    """What a charge's refunds (`refunded`, in all) gave back of each invoice its payment paid,
    by Stripe id; `paid`: each invoice, what the payment paid of it, what its credit notes
    refunded of the charge and what they gave back otherwise (credited), in the order Stripe
    lists their payments; `counted`: what was counted of the charge on each before.

    A credit note's refund is its invoice's. A refund outside any credit note names no invoice:
    it is counted against the invoices in that order, each within what its credit notes left
    of what the payment paid of it (beyond that only when none has any left). What was counted
    on an invoice stays counted there. So each unit refunded counts once in all, on one
    invoice, and no invoice's part shrinks as refunds and credit notes are added."""
    parts = {
        invoice_id: max(int(counted.get(invoice_id, 0)), min(noted, amount))
        for invoice_id, amount, noted, _ in paid
    }
    outside = max(0, refunded - sum(parts.values()))
    for within_credits in (True, False):
        for invoice_id, amount, _, credited in paid:
            room = amount - (credited if within_credits else 0) - parts[invoice_id]
            share = max(0, min(outside, room))
            parts[invoice_id] += share
            outside -= share
    return parts


def invoice_credits_total(invoice: Invoice) -> None:
    """Store what refunds and credit notes take off the (locked) invoice: refunded to the
    payment, the charges' refunds or, when more (a credit note's refund whose charge event
    has not come yet), the issued credit notes'; and credited, what those took off beyond
    their refunds. A refund outside any credit note counts once, with the charge's."""
    issued = invoice.credit_notes.filter(status=CreditNote.Status.ISSUED)
    noted = sum((note.amount for note in issued), Decimal(0))
    noted_refunds = sum((note.refunded for note in issued), Decimal(0))
    charged = sum(
        (_money(amount, invoice.currency) for amount in invoice.charge_refunds.values()),
        Decimal(0),
    )
    Invoice.objects.filter(pk=invoice.pk).update(
        amount_refunded=max(charged, noted_refunds), amount_credited=noted - noted_refunds
    )


def subscription_end(subscription: Subscription) -> None:
    """Tell Stripe to end the tenant's Stripe subscription when its period ends (the usage
    until then is invoiced then), or, for one still waiting for payment, to close its Checkout
    page (it can no longer be paid). Runs inside the cancelling transaction: when Stripe cannot
    be told, a ValidationError says so and nothing is cancelled. Nothing to do without Stripe
    or for a subscription Stripe does not bill."""
    gw = gateway()
    if gw is None:
        return
    try:
        if subscription.stripe_subscription_id:
            gw.subscription_cancel_at_period_end(
                subscription.stripe_subscription_id, for_=subscription.pk
            )
        elif subscription.stripe_customer_id:
            page = gw.checkout_session_open(
                customer_id=subscription.stripe_customer_id, subscription_id=subscription.pk
            )
            if page is not None:
                gw.checkout_session_expire(page.id)
    except StripeRefused as exc:
        if subscription.stripe_subscription_id and _ended_in_stripe(gw, subscription, exc):
            # Ended in Stripe already (its dashboard, its dunning, its customer deleted), the
            # webhook saying so late or lost: nothing bills it any more, and ours ends too,
            # its usage not sent yet billed on Opsdeck's invoice, as when the webhook comes.
            log.info("subscription %s: Stripe had ended it already", subscription.pk)
            meter_events.unsent_to_local(
                tenant_id=subscription.tenant_id, plan_id=subscription.plan_id
            )
            return
        log.error("cancelling subscription %s in Stripe: %s", subscription.pk, exc)
        raise ValidationError(
            "Stripe refused to end it, so nothing was cancelled: ask the platform team."
        ) from exc
    except StripeFailure as exc:
        log.error("cancelling subscription %s in Stripe: %s", subscription.pk, exc)
        raise ValidationError(
            "Stripe could not be reached, so nothing was cancelled; please try again."
        ) from exc


# A Stripe subscription in these bills nothing more.
_STRIPE_ENDED = {"canceled", "incomplete_expired"}


def _ended_in_stripe(gw: StripeGateway, subscription: Subscription, refused: StripeRefused) -> bool:
    """Whether Stripe refused to end the subscription because it is over there already: gone,
    or ended."""
    if refused.status == 404:
        return refused.gone
    try:
        held = gw.subscription(subscription.stripe_subscription_id)
    except StripeRefused as exc:
        return exc.gone
    return _field(held, "status") in _STRIPE_ENDED


def checkout_completed(session: Any) -> StripeCustomer | None:
    """A finished checkout (freshly fetched): remember the customer Stripe holds for the tenant
    named by `client_reference_id` (the tenant's id, as the checkout is created). Only a page
    Opsdeck made counts, one whose metadata names a subscription of that tenant: a reference
    alone is no proof, since a buyer can set it in a payment link's address, and another sale
    of the same Stripe account would bind a stranger's customer to the tenant."""
    reference = _key(_field(session, "client_reference_id"))
    ours = _key(_field(_field(session, "metadata"), "opsdeck_subscription"))
    if reference is None or ours is None or not _field(session, "customer"):
        return None
    subscription = (
        Subscription.objects.select_related("tenant").filter(pk=ours, tenant_id=reference).first()
    )
    if subscription is None:
        log.warning("checkout %s names no subscription of ours: ignored", _field(session, "id"))
        return None
    return customer_remember(tenant=subscription.tenant, customer_id=session.customer)
