"""Subscriptions staff suspended before `suspended_by_staff` existed are held as staff's too:
the last suspension audited for each suspended subscription says who made it."""

from django.db import migrations


def fill(apps, schema_editor):
    Subscription = apps.get_model("billing", "Subscription")
    AuditEvent = apps.get_model("accounts", "AuditEvent")
    for subscription in Subscription.objects.filter(status="suspended").only("pk"):
        last = (
            AuditEvent.objects.filter(
                action="subscription.suspend",
                target_type="subscription",
                target_id=str(subscription.pk),
                result="ok",
            )
            .order_by("-created_at", "-pk")
            .values_list("actor_kind", flat=True)
            .first()
        )
        if last == "staff":
            Subscription.objects.filter(pk=subscription.pk).update(suspended_by_staff=True)


class Migration(migrations.Migration):
    dependencies = [
        ("billing", "0011_subscription_suspended_by_staff"),
        ("accounts", "0006_invitation_unsent_index"),
    ]

    operations = [migrations.RunPython(fill, migrations.RunPython.noop)]
