"""`manage.py close_billing_period --period 2026-11`: close a month into draft invoices, as the
monthly `billing-close-period` beat task does for the month just ended."""

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from billing import invoicing, pricing


class Command(BaseCommand):
    help = (
        "Close a billing period (a month, YYYY-MM) into one draft invoice per organization and "
        "plan, once every hour of it is metered. Staff then finalize or void the drafts."
    )

    def add_arguments(self, parser):
        parser.add_argument("--period", required=True, help="the month to close, e.g. 2026-11")

    def handle(self, *args, **options):
        try:
            closed = invoicing.period_close(options["period"])
        except ValidationError as exc:
            raise CommandError(" ".join(exc.messages)) from None
        if not closed.invoices:
            self.stdout.write(f"Closed {closed.period}: no usage, no invoice.")
            return
        self.stdout.write(f"Closed {closed.period}: {len(closed.invoices)} draft invoice(s).")
        for invoice in closed.invoices:
            self.stdout.write(
                f"  {invoice.tenant.slug} · {invoice.plan.key}: "
                f"{pricing.rounded(invoice.total, invoice.currency)} "
                f"{invoice.currency.upper()}"
            )
