from django.db import migrations, models


class Migration(migrations.Migration):
    """An invitation records the attempts to send its email and when one went out, so that beat
    sends again the ones a lost message or a mail server's refusal left unsent. The pending ones
    made before were sent when they were made, as far as anyone knows: they count as emailed
    then, and are not sent a second time (the others are never sent again in any case)."""

    dependencies = [
        ("accounts", "0004_request_keys_created"),
    ]

    operations = [
        migrations.AddField(
            model_name="invitation",
            name="emailed_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="invitation",
            name="email_attempted_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="invitation",
            name="email_attempts",
            field=models.PositiveSmallIntegerField(default=0),
        ),
        migrations.RunSQL(
            "UPDATE accounts_invitation SET emailed_at = created_at"
            " WHERE accepted_at IS NULL AND revoked_at IS NULL",
            reverse_sql=migrations.RunSQL.noop,
        ),
    ]
