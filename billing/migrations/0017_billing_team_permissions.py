from django.contrib.auth.management import create_permissions
from django.db import migrations

BILLING_TEAM = "Billing team"

# What the billing team does in the admin (the README's Billing): review every billing row,
# finalize, void or mark invoices paid, approve, suspend or cancel subscriptions, set price and
# limit overrides, and retry meter events.
GRANTED = [
    *(
        f"view_{model}"
        for model in [
            "plan", "price", "pastprice", "usagerecord", "meteredhour", "billingperiod",
            "invoice", "subscription", "planoverride", "meterevent", "stripeevent",
            "stripecustomer", "stripemeter", "stripeprice",
        ]
    ),
    "change_invoice",
    "change_subscription",
    "change_meterevent",
    "add_planoverride",
    "change_planoverride",
]  # fmt: skip


def grant(apps, schema_editor):
    # On a new database the permissions are made after every migration: make billing's now.
    billing = apps.get_app_config("billing")
    billing.models_module = getattr(billing, "models_module", None) or True  # as it needs
    create_permissions(billing, apps=apps, verbosity=0)
    Group = apps.get_model("auth", "Group")
    Permission = apps.get_model("auth", "Permission")
    team, _ = Group.objects.get_or_create(name=BILLING_TEAM)
    team.permissions.add(
        *Permission.objects.filter(content_type__app_label="billing", codename__in=GRANTED)
    )


def revoke(apps, schema_editor):
    Group = apps.get_model("auth", "Group")
    Permission = apps.get_model("auth", "Permission")
    for team in Group.objects.filter(name=BILLING_TEAM):
        team.permissions.remove(
            *Permission.objects.filter(content_type__app_label="billing", codename__in=GRANTED)
        )


class Migration(migrations.Migration):
    """The billing team's group may do in the admin what the billing team does there; before,
    it reached the billing team's pages only, and the admin refused it until a superuser gave
    it permissions by hand."""

    dependencies = [
        ("billing", "0016_usage_once_per_plan"),
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
    ]

    operations = [migrations.RunPython(grant, revoke)]
