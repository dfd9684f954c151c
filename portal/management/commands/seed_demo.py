from allauth.account.models import EmailAddress
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from accounts import services
from accounts.audit import SYSTEM, Actor
from accounts.models import Tenant, User
from billing import services as billing_services
from billing.models import Plan

DEMO_EMAIL = "demo@opsdeck.example"
DEMO_PASSWORD = "opsdeck-demo"  # noqa: S105 - a published demo credential, not a secret
DEMO_TENANT = "Demo Company"


class Command(BaseCommand):
    help = (
        "Create the demo user (verified email) and the organization they own, subscribed to "
        "every loaded plan (run load_specs first); idempotent."
    )

    def add_arguments(self, parser):
        parser.add_argument("--password", default=DEMO_PASSWORD, help="the demo user's password")
        parser.add_argument(
            "--production",
            action="store_true",
            help="seed even though DEBUG is off (the demo password is public)",
        )

    @transaction.atomic
    def handle(self, *args, password, production, **options):
        if not settings.DEBUG and not production and password == DEMO_PASSWORD:
            raise CommandError(
                "DEBUG is off: refusing to create an account with the published demo password. "
                "Pass --password, or --production if you really mean it."
            )
        user, _ = User.objects.get_or_create(email=DEMO_EMAIL)
        user.set_password(password)
        user.save()
        EmailAddress.objects.update_or_create(
            user=user, email=DEMO_EMAIL, defaults={"verified": True, "primary": True}
        )
        tenant = Tenant.objects.for_user(user).filter(name=DEMO_TENANT).first()
        if tenant is None:
            tenant = services.tenant_create(actor=Actor(user=user), name=DEMO_TENANT)
        for plan in Plan.objects.all():
            billing_services.subscription_create_active(actor=SYSTEM, tenant=tenant, plan=plan)
        self.stdout.write(
            "Demo ready. Sign in with\n"
            f"  email:        {DEMO_EMAIL}\n"
            f"  password:     {password}\n"
            f"  organization: {tenant.name} (/t/{tenant.slug}/)"
        )
