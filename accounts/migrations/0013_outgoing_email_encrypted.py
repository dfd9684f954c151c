import accounts.crypto
from django.db import migrations


def encrypt_waiting(apps, schema_editor):
    """Emails written before their bodies were encrypted: encrypted now (read as plain text by
    the model as it was)."""
    OutgoingEmail = apps.get_model("accounts", "OutgoingEmail")
    for email in OutgoingEmail.objects.all().only("body", "html"):
        OutgoingEmail.objects.filter(pk=email.pk).update(
            body=accounts.crypto.encrypt(email.body),
            html=accounts.crypto.encrypt(email.html) if email.html else "",
        )


class Migration(migrations.Migration):
    dependencies = [
        ("accounts", "0012_outgoing_email"),
    ]

    operations = [
        migrations.RunPython(encrypt_waiting, migrations.RunPython.noop),
        migrations.AlterField(
            model_name="outgoingemail",
            name="body",
            field=accounts.crypto.EncryptedTextField(),
        ),
        migrations.AlterField(
            model_name="outgoingemail",
            name="html",
            field=accounts.crypto.EncryptedTextField(blank=True),
        ),
    ]
