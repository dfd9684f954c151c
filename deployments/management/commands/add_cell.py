import json
from pathlib import Path

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from deployments import services
from deployments.models import Cell, Instance


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
        parser.add_argument("--default", action="store_true", help="make it the default cell")

    def handle(self, *args, **options):
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
        default = " (default)" if cell.is_default else ""
        done = "updated: only the options given changed" if before else "registered"
        self.stdout.write(f"Cell {cell.name} {done}{default}.")
        if before and before.customer_sources != cell.customer_sources:
            kept = cell.instances.exclude(state=Instance.State.DELETED).count()
            if kept:
                self.stdout.write(
                    f"Its customer sources changed: instances created from now on admit "
                    f"{', '.join(cell.customer_sources) or 'none'}; the {kept} it runs already "
                    "keep the network policy they were created with."
                )
