"""`manage.py meter_usage` and the `usage-meter` beat task."""

from datetime import UTC, datetime, timedelta
from io import StringIO

import pytest
from django.conf import settings
from django.core.management import CommandError, call_command

from billing.models import MeteredHour, UsageRecord
from deployments import metering
from deployments.models import Instance
from portal.celery import app
from tests.deployments import factories

HOUR = datetime(2026, 11, 29, 13, tzinfo=UTC)


@pytest.fixture
def running(tenant):
    """One instance of the default size, running since 10:00 on HOUR's day."""
    return Instance.objects.create(
        tenant=tenant,
        name="db",
        plan_version=factories.postgres_version(),
        cell=factories.cell(),
        parameters={"instances": 1, "cpu": 1, "memoryGi": 2, "storageGi": 10},
        state=Instance.State.RUNNING,
        created_at=HOUR - timedelta(hours=3),
    )


@pytest.fixture
def now(monkeypatch):
    """Pretend it is 14:05, five minutes after HOUR ended."""
    moment = HOUR + timedelta(hours=1, minutes=5)
    monkeypatch.setattr(metering.timezone, "now", lambda: moment)
    return moment


def meter(*args: str) -> str:
    out = StringIO()
    call_command("meter_usage", *args, stdout=out)
    return out.getvalue()


def test_one_full_hour_is_metered_on_request(running, now):
    out = meter("--hour", "2026-11-29T13:00Z")

    # 1 core at 0.035, 2 GiB of memory at 0.005 and 10 GiB of storage at 0.00014 an hour.
    assert out == (
        "2026-11-29T13:00Z: 1 instance(s), 5 new usage record(s) of 5, worth 0.0464 usd, "
        "billed in 2026-11\n"
    )
    assert set(UsageRecord.objects.values_list("hour", flat=True)) == {HOUR}
    assert meter("--hour", "2026-11-29T13:00Z").startswith(
        "2026-11-29T13:00Z: 1 instance(s), 0 new usage record(s) of 5"
    )
    assert UsageRecord.objects.count() == 5


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--hour", "2026-11-29T13:30Z"], "--hour 2026-11-29T13:30Z is not the start of an hour"),
        (["--hour", "2026-11-29T14:00Z"], "--hour 2026-11-29T14:00Z has not ended yet, or ended "
                                          "less than 2 minutes ago; the last hour that may be "
                                          "metered is 2026-11-29T13:00Z."),
        (["--hour", "yesterday"], "--hour yesterday is not a UTC hour like 2026-11-29T13:00Z."),
        (["--backfill-from", "2026-11-30T00:00Z"], "--backfill-from 2026-11-30T00:00Z has not "
                                                   "ended yet"),
    ],
)  # fmt: skip
def test_an_hour_that_is_not_a_full_past_one_is_refused_with_one_line(running, now, args, message):
    with pytest.raises(CommandError, match="^" + message.replace(".", r"\.")):
        meter(*args)

    assert not MeteredHour.objects.exists()


def test_backfill_from_meters_every_unmetered_hour_up_to_the_last_full_one(running, now):
    meter("--hour", "2026-11-29T11:00Z")

    out = meter("--backfill-from", "2026-11-29T10:00Z")

    assert [line.split(":")[0] + ":00Z" for line in out.splitlines()] == [
        "2026-11-29T10:00Z", "2026-11-29T12:00Z", "2026-11-29T13:00Z",
    ]  # fmt: skip
    assert MeteredHour.objects.count() == 4


def test_without_options_it_meters_the_hours_due_and_then_has_nothing_to_do(running, now):
    first = meter()

    assert first.splitlines()[-1].startswith("2026-11-29T13:00Z: 1 instance(s)")
    assert meter() == "Nothing to meter: every hour is metered.\n"


def test_the_beat_entry_runs_the_metering_task(running, now):
    entry = settings.CELERY_BEAT_SCHEDULE["usage-meter"]
    app.loader.import_default_modules()  # what a worker does at start: the apps' tasks

    hours = app.tasks[entry["task"]].apply().get()

    assert hours == MeteredHour.objects.count() > 0
    assert MeteredHour.objects.order_by("-hour").first().hour == HOUR
    assert entry["schedule"] <= 3600


def test_a_month_before_the_first_instance_closes_once_the_command_its_refusal_names_is_run(
    tenant, monkeypatch
):
    december = datetime(2026, 12, 1, tzinfo=UTC)
    monkeypatch.setattr(metering.timezone, "now", lambda: december + timedelta(hours=2, minutes=5))
    Instance.objects.create(
        tenant=tenant, name="first", plan_version=factories.postgres_version(),
        cell=factories.cell(), state=Instance.State.RUNNING,
        parameters={"instances": 1, "cpu": 1, "memoryGi": 2, "storageGi": 10},
        created_at=december + timedelta(minutes=30),
    )  # fmt: skip
    meter()  # as beat does: the first instance's month on, November untouched

    with pytest.raises(CommandError) as refused:
        call_command("close_billing_period", "--period", "2026-11")
    advised = str(refused.value).split("`")[1]
    assert advised == "meter_usage --backfill-from 2026-11-01T00:00Z"
    meter(*advised.split()[1:])
    out = StringIO()
    call_command("close_billing_period", "--period", "2026-11", stdout=out)

    assert out.getvalue() == "Closed 2026-11: no usage, no invoice.\n"
