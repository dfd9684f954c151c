from django.db import models
from django.utils import timezone


class Plan(models.Model):
    """A tier a tenant can run instances on; the commercial record of a service plan spec."""

    key = models.SlugField(max_length=100, unique=True)
    name = models.CharField(max_length=200)
    service = models.SlugField(max_length=100)
    description = models.TextField(blank=True)
    # Plain limits from the spec, e.g. {"max_instances": 5}.
    limits = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["service", "name"]

    def __str__(self) -> str:
        return self.name

    @property
    def max_instances(self) -> int | None:
        value = self.limits.get("max_instances")
        return int(value) if value is not None else None
