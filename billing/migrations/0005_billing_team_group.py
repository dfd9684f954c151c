from django.db import migrations

BILLING_TEAM = "Billing team"


def create(apps, schema_editor):
    apps.get_model("auth", "Group").objects.get_or_create(name=BILLING_TEAM)


def remove(apps, schema_editor):
    apps.get_model("auth", "Group").objects.filter(name=BILLING_TEAM).delete()


class Migration(migrations.Migration):
    """The group whose staff members reach the billing team's pages (/billing-team/)."""

    dependencies = [("billing", "0004_invoices"), ("auth", "0012_alter_user_first_name_max_length")]

    operations = [migrations.RunPython(create, remove)]
