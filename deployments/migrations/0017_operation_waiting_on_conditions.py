"""`Operation.waiting_on` entries became objects (`{"object": "Kind/name", "apiVersion": …,
"conditions": […]}`, `engine.waiting_on`) instead of "Kind/name" strings. An operation that
waits on nothing in particular is woken by any change of its instance, and its next move
records what it waits on in the new form: so the old entries are cleared."""

from django.db import migrations


def clear_old_entries(apps, schema_editor):
    Operation = apps.get_model("deployments", "Operation")
    Operation.objects.exclude(waiting_on=[]).update(waiting_on=[])


class Migration(migrations.Migration):
    dependencies = [
        ("deployments", "0016_operation_waiting_on"),
    ]

    operations = [
        migrations.RunPython(clear_old_entries, migrations.RunPython.noop),
    ]
