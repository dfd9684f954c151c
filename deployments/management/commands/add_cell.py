import json
from pathlib import Path

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from deployments import services
from deployments.models import Cell

PROGRESS_EVERY = 100  # instances between two lines saying how far a pass of many has gone


class Command(BaseCommand):
    help = (
        "Register a Kubernetes cluster as a cell after checking that it answers and serves the "
        "kinds the plans that may run on it use (their operators are installed). The kubeconfig "
        "is stored encrypted."
    )

    def add_arguments(self, parser):
        parser.add_argument("--name", required=True)
        parser.add_argument("--kubeconfig", required=True, help="path of a kubeconfig file")
        # Each option left out keeps the cell's setting when it exists (empty for a new one).
        parser.add_argument("--context", help="kubeconfig context (default: current)")
        parser.add_argument("--region")
        parser.add_argument("--cloud")
        parser.add_argument(
            "--model",
            choices=Cell.DeploymentModel.values,
            help=f"default for a new cell: {Cell.DeploymentModel.HOSTED}",
        )
        parser.add_argument(
            "--backup-destination", help="object store prefix, e.g. s3://bucket/path"
        )
        parser.add_argument(
            "--backup-credentials",
            help="JSON file with ACCESS_KEY_ID and ACCESS_SECRET_KEY for the object store",
        )
        parser.add_argument(
            "--operator-namespace",
            help="where the operators run in this cluster (default: the namespace each plan's "
            "spec names)",
        )
        parser.add_argument(
            "--customer-sources",
            metavar="CIDRS",
            help="comma-separated address ranges customers reach their instances from, e.g. "
            '203.0.113.0/24,2001:db8::/32 ("" for none): each new instance\'s network policy '
            "admits them on its plan's port",
        )
        parser.add_argument(
            "--apply-namespaces",
            action="store_true",
            help="apply the guard rails of every instance the cell runs again, as its settings "
            "render them now (done without it when the customer sources, operator namespace or "
            "backup credentials change, and by each run until one applied them everywhere)",
        )
        parser.add_argument(
            "--at-once",
            type=int,
            default=services.APPLY_AT_ONCE,
            metavar="N",
            help="instances whose guard rails are applied again at the same time (default "
            f"{services.APPLY_AT_ONCE})",
        )
        parser.add_argument("--default", action="store_true", help="make it the default cell")

    def handle(self, *args, **options):
        if options["at_once"] < 1:
            raise CommandError("--at-once must be at least 1.")
        try:
            kubeconfig = Path(options["kubeconfig"]).read_text()
            credentials = (
                json.loads(Path(options["backup_credentials"]).read_text())
                if options["backup_credentials"] is not None
                else None
            )
        except (OSError, ValueError) as exc:
            raise CommandError(str(exc)) from exc
        sources = options["customer_sources"]
        if sources is not None:
            sources = [source for source in sources.split(",") if source.strip()]
        before = Cell.objects.filter(name=options["name"]).first()
        try:
            cell = services.cell_register(
                name=options["name"],
                kubeconfig=kubeconfig,
                context=options["context"],
                region=options["region"],
                cloud=options["cloud"],
                deployment_model=options["model"],
                backup_destination=options["backup_destination"],
                backup_credentials=credentials,
                operator_namespace=options["operator_namespace"],
                customer_sources=sources,
                make_default=options["default"],
            )
        except ValidationError as exc:
            raise CommandError("; ".join(exc.messages)) from exc
        except KeyboardInterrupt:  # Ctrl-C while the cluster is asked: said, not a traceback
            raise CommandError(
                "Stopped while the cluster was checked, before the cell was saved: nothing "
                "changed.",
                returncode=130,
            ) from None
        default = " (default)" if cell.is_default else ""
        done = "updated: only the options given changed" if before else "registered"
        self.stdout.write(f"Cell {cell.name} {done}{default}.")
        unchanged = before is not None and before.settings_generation == cell.settings_generation
        if unchanged and cell.guard_rails_behind:
            self.stdout.write(
                "The guard rails of the cell's instances were not all applied again since its "
                "settings last changed (a run stopped, or the cluster refused some): applying "
                "them now."
            )
        if options["apply_namespaces"] or cell.guard_rails_behind:
            self._namespaces_apply(cell, options["at_once"])

    def _namespaces_apply(self, cell: Cell, at_once: int) -> None:
        def each(done: services.NamespacesApplied) -> None:
            nonlocal so_far
            for instance_id, why in done.failed[len(said) :]:  # as they come: a pass is long
                self.stderr.write(f"{instance_id}: {why}")
                said.append(instance_id)
            if done.passed % PROGRESS_EVERY == 0 and done.passed < done.total:
                self.stdout.write(f"… {done.passed:,} of {done.total:,} instances")
                self.stdout.flush()
            so_far = done

        said: list[str] = []
        so_far = services.NamespacesApplied()
        try:
            done = services.cell_namespaces_apply(cell, each=each, at_once=at_once)
        except KeyboardInterrupt:  # Ctrl-C: said, with what it leaves, not as a traceback
            count = so_far.passed
            again = (
                "its guard rails are behind until a run applies them in every instance's "
                "namespace; run add_cell for the cell again."
                if cell.guard_rails_behind
                else "run add_cell --apply-namespaces again to apply them in the others."
            )
            raise CommandError(
                f"Stopped after {count:,} instance{'' if count == 1 else 's'} of the cell: {again}",
                returncode=130,  # a command Ctrl-C stopped, as a shell says it
            ) from None
        self.stdout.write(
            f"Guard rails applied again in the namespaces of {done.applied} instance"
            f"{'' if done.applied == 1 else 's'} of the cell"
            + (f" ({done.left} left to their create or delete)." if done.left else ".")
        )
        if done.gave_up:
            left = done.total - done.passed
            raise CommandError(
                f"Stopped with {left:,} instance{'' if left == 1 else 's'} of the cell left: the "
                f"cluster refused the last {services.SAME_REFUSAL_STOPS} alike ({done.gave_up}). "
                "Run add_cell for the cell again once it takes them; the cell watcher "
                "(watch_cells) also tries again, less and less often."
            )
        if done.failed:
            count = len(done.failed)
            raise CommandError(
                f"{count} instance{'' if count == 1 else 's'} could not be updated: run add_cell "
                "for the cell again once the cluster takes them (it applies them again until "
                "every instance has them)."
            )
