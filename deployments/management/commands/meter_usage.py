"""`manage.py meter_usage [--hour 2026-11-29T13:00Z] [--backfill-from 2026-11-01T00:00Z]`:
meter usage by hand, as the `usage-meter` beat task does."""

from datetime import UTC, datetime

from django.core.management.base import BaseCommand, CommandError

from billing import usage
from deployments import metering

_FORMATS = ("%Y-%m-%dT%H:%MZ", "%Y-%m-%dT%H:%M:%SZ", "%Y-%m-%dT%H:%M")


def _hour(text: str, option: str) -> datetime:
    for fmt in _FORMATS:
        try:
            moment = datetime.strptime(text, fmt).replace(tzinfo=UTC)
        except ValueError:
            continue
        if not usage.is_hour_start(moment):
            raise CommandError(f"{option} {text} is not the start of an hour (e.g. 13:00Z).")
        return moment
    raise CommandError(f"{option} {text} is not a UTC hour like 2026-11-29T13:00Z.")


class Command(BaseCommand):
    help = (
        "Record each instance's usage per dimension for full UTC hours. Without options: every "
        "full hour not metered yet (as the usage-meter beat task). Metering an hour again "
        "changes nothing."
    )

    def add_arguments(self, parser):
        which = parser.add_mutually_exclusive_group()
        which.add_argument("--hour", help="one full hour, e.g. 2026-11-29T13:00Z")
        which.add_argument(
            "--backfill-from",
            help="every hour not metered yet from this one up to the last full hour",
        )

    def handle(self, *args, **options):
        last = metering.last_full_hour()
        if options["hour"]:
            hour = _hour(options["hour"], "--hour")
            if hour > last:
                raise CommandError(
                    f"--hour {options['hour']} has not ended yet, or ended less than "
                    f"{metering.SETTLE.seconds // 60} minutes ago; the last hour that may be "
                    f"metered is {last:%Y-%m-%dT%H:%MZ}."
                )
            hours = [hour]
        elif options["backfill_from"]:
            first = _hour(options["backfill_from"], "--backfill-from")
            if first > last:
                raise CommandError(
                    f"--backfill-from {options['backfill_from']} has not ended yet; the last "
                    f"full hour is {last:%Y-%m-%dT%H:%MZ}."
                )
            hours = usage.unmetered_hours(first, last + usage.HOUR)
        else:
            hours = metering.hours_due()
        if not hours:
            self.stdout.write("Nothing to meter: every hour is metered.")
            return
        for recorded in metering.meter_hours(hours):
            where = recorded.period + (" (adjustment)" if recorded.adjustment else "")
            cost = usage.hour_cost(recorded.hour)
            worth = ", ".join(f"{amount} {currency}" for currency, amount in sorted(cost.items()))
            self.stdout.write(
                f"{recorded.hour:%Y-%m-%dT%H:%MZ}: {recorded.instances} instance(s), "
                f"{recorded.inserted} new usage record(s) of {recorded.rows}, "
                f"worth {worth or 'nothing'}, billed in {where}"
            )
