from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("deployments", "0020_instance_name_once"),
    ]

    operations = [
        migrations.AlterField(
            model_name="snapshot",
            name="status",
            field=models.CharField(
                choices=[
                    ("pending", "Pending"),
                    ("completed", "Completed"),
                    ("failed", "Failed"),
                    ("cancelled", "Cancelled"),
                    ("deleted", "Deleted"),
                ],
                default="pending",
                max_length=10,
            ),
        ),
    ]
