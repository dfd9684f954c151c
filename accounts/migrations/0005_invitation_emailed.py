from django.db import migrations, models


class Migration(migrations.Migration):
    """An invitation records when its email went out, so that beat sends again the ones a lost
    message or a mail server's refusal left unsent. Those made before were sent when they were
    made, as far as anyone knows: they count as emailed then, and are not sent a second time."""

    dependencies = [
        ("accounts", "0004_request_keys_created"),
    ]

    operations = [
        migrations.AddField(
            model_name="invitation",
            name="email_retries",
            field=models.PositiveSmallIntegerField(default=0),
        ),
        migrations.AddField(
            model_name="invitation",
            name="emailed_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.RunSQL(
            "UPDATE accounts_invitation SET emailed_at = created_at",
            reverse_sql=migrations.RunSQL.noop,
        ),
        migrations.AddIndex(
            model_name="invitation",
            index=models.Index(
                condition=models.Q(accepted_at=None, emailed_at=None, revoked_at=None),
                fields=["created_at"],
                name="invitation_unsent",
            ),
        ),
    ]
