import django.db.models.functions.text
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("accounts", "0007_invitations_open_apart"),
    ]

    operations = [
        migrations.AddConstraint(
            model_name="invitation",
            constraint=models.UniqueConstraint(
                models.F("tenant"),
                django.db.models.functions.text.Lower("email"),
                condition=models.Q(("accepted_at", None), ("revoked_at", None)),
                name="invitation_open_once",
            ),
        ),
    ]
