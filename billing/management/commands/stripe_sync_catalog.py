"""`manage.py stripe_sync_catalog`: Stripe meters, products and metered prices for our plans."""

from django.core.management.base import BaseCommand, CommandError

from billing import stripe_sync
from billing.stripe_gateway import StripeFailure, gateway


class Command(BaseCommand):
    help = (
        "Create in Stripe a product per plan and, per plan and priced usage dimension, a meter "
        "and a metered monthly price on it, and store their ids. Existing ones are found (by "
        "event name, product id, lookup key): running it again creates nothing. A changed "
        "price is replaced, and every subscription is put on its plan's prices in effect in its "
        "current period (a changed price reaches it once its period from the change on began)."
    )

    def handle(self, *args, **options):
        gw = gateway()
        if gw is None:
            raise CommandError("STRIPE_API_KEY is not set: billing is local, there is no catalog.")
        try:
            done = stripe_sync.catalog_sync(gw, out=lambda item: self.stdout.write(str(item)))
        except StripeFailure as exc:
            raise CommandError(f"Stripe: {exc}") from exc
        created = sum(item.action == "created" for item in done)
        found = sum(item.action == "found" for item in done)
        items = len(done) - created - found
        summary = f"{created} created, {found} found."
        if items:
            plural = "s" if items != 1 else ""
            summary += f" {items} subscription item{plural} put on the prices of their period."
        self.stdout.write(self.style.SUCCESS(summary))
