from celery import shared_task

from deployments import runner, status


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
