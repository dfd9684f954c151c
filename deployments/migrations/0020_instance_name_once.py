import django.db.models.functions.text
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("deployments", "0019_instance_names_apart"),
    ]

    operations = [
        migrations.AddConstraint(
            model_name="instance",
            constraint=models.UniqueConstraint(
                models.F("tenant"),
                django.db.models.functions.text.Lower("name"),
                condition=models.Q(("state", "deleted"), _negated=True),
                name="instance_name_once",
            ),
        ),
    ]
