from celery import shared_task

from deployments import fleet, health, runner, services, status


@shared_task
def operation_step(operation_id: str) -> None:
    """Advance an operation by one step; it schedules its own next step."""
    runner.operation_step(operation_id)


@shared_task
def operations_sweep() -> int:
    """Re-enqueue operations that stalled (run every 30 s by beat)."""
    return runner.operations_sweep()


@shared_task
def instances_observe() -> int:
    """Read the operator's status of every instance (run every 30 s by beat)."""
    return status.instances_observe()


@shared_task
def instances_health() -> dict[str, int]:
    """Bring running instances' health up to their observed status (run every 30 s by beat)."""
    return health.instances_assess()


@shared_task
def backups_run_due() -> dict[str, int]:
    """Queue the backups whose scheduled slot has come (run every minute by beat)."""
    return services.backups_run_due()


@shared_task
def snapshots_prune() -> int:
    """Forget the snapshots their retention no longer keeps (run every 10 minutes by beat)."""
    return services.snapshots_prune()


@shared_task
def usage_meter() -> int:
    """Meter every full hour not metered yet (run every 5 minutes by beat, so an hour is
    metered within minutes of its end; metering it again changes nothing)."""
    from deployments import metering

    return len(metering.meter_due())


@shared_task
def suspended_instances_stop() -> dict[str, int]:
    """Stop the running instances of long-suspended subscriptions (run hourly by beat)."""
    return services.suspended_instances_stop()


@shared_task
def server_samples_take() -> int:
    """Sample the CPU and memory of every running instance's servers, and forget samples older
    than 7 days (run every minute by beat)."""
    from deployments import metrics

    return metrics.samples_take()


@shared_task
def fleet_run_advance(run_id: int) -> bool:
    """Queue a fleet run's next batch of operations; it sends the one after."""
    return fleet.fleet_run_advance(run_id)


@shared_task
def fleet_runs_resume() -> int:
    """Send again the fleet runs no worker holds (run every minute by beat)."""
    return fleet.fleet_runs_resume()
