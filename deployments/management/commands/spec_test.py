"""`manage.py spec_test FILE [--keep]`: run every workflow of a spec on a fresh sandbox cluster."""

import time
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from deployments import spectest
from deployments.management.commands.validate_spec import unreadable
from deployments.spec import SpecError, load_spec

ROW = "{:<24} {:<8} {:>9}"


class Command(BaseCommand):
    help = (
        "Run every system and custom workflow of a spec against a fresh in-process sandbox "
        "cluster, in the order an instance lives through them (create, modify, failover, custom "
        "verbs, stop, start, restart, applyBackupRetention, backup, restore into a new instance, "
        "deleteBackup, delete), and print each verb's result and duration; exits 1 when any "
        "verb failed. Parameters take their defaults; modify moves the first modifiable "
        "Float64 parameter to another allowed value. $sys describes a pretend cell: region "
        "'local', cloud 'sandbox', subnets subnet-a and subnet-b, backup destination "
        "s3://spec-test/backups, tenant 'spec-test', and the instance type from the "
        "instanceType parameter if there is one; --cell NAME describes a registered cell instead."
    )
    requires_system_checks = []

    def add_arguments(self, parser):
        parser.add_argument("file", metavar="FILE", help="a spec file (YAML)")
        parser.add_argument(
            "--keep",
            action="store_true",
            help="leave the sandbox running afterwards, print its URL and kubeconfig, and wait "
            "for Ctrl-C",
        )
        parser.add_argument(
            "--cell",
            metavar="NAME",
            help="describe this registered cell in $sys (region, cloud, subnets, network, "
            "backup destination) instead of the pretend one; objects still go to the sandbox",
        )
        parser.add_argument(
            "--speed",
            type=float,
            default=spectest.SPEED,
            help=f"the sandbox's time factor (default {spectest.SPEED:g})",
        )
        parser.add_argument(
            "--timeout",
            type=float,
            default=spectest.VERB_TIMEOUT,
            help="wall-clock seconds one verb may take before it counts as failed "
            f"(default {spectest.VERB_TIMEOUT:g})",
        )

    def handle(self, *args, **options):
        path = options["file"]
        try:
            spec = load_spec(Path(path).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError) as exc:
            raise CommandError(f"{path}: {unreadable(exc)}") from exc
        except SpecError as exc:
            raise CommandError(f"{path}: {'; '.join(exc.errors)}") from exc
        if options["speed"] <= 0 or options["timeout"] <= 0:
            raise CommandError("--speed and --timeout must be positive.")

        cell = None
        if options["cell"]:
            from deployments.models import Cell  # the only use of the database here

            found = Cell.objects.filter(name=options["cell"]).first()
            if found is None:
                raise CommandError(f"No cell is registered as {options['cell']!r}.")
            cell = spectest.SpecTestCell.from_cell(found)

        self.stdout.write(ROW.format("verb", "result", "duration"))
        with spectest.sandbox_driver(speed=options["speed"]) as (sandbox, driver):
            results = spectest.run(
                spec, driver, cell=cell, verb_timeout=options["timeout"], on_result=self.row
            )
            counts = {r: sum(x.result == r for x in results) for r in spectest.RESULTS}
            summary = [f"{counts[spectest.PASSED]} passed", f"{counts[spectest.FAILED]} failed"]
            summary += [
                f"{counts[r]} {r}" for r in (spectest.SKIPPED, spectest.NOT_RUN) if counts[r]
            ]
            self.stdout.write(", ".join(summary))
            if options["keep"]:
                self.keep(sandbox)
        if counts[spectest.FAILED]:
            raise CommandError(f"{counts[spectest.FAILED]} verb(s) of {path} failed.")

    def row(self, result: spectest.VerbResult) -> None:
        ran = result.result in {spectest.PASSED, spectest.FAILED}
        duration = f"{result.seconds:.2f}s" if ran else "-"
        self.stdout.write(ROW.format(result.verb, result.result, duration))
        if result.result == spectest.FAILED:
            self.stdout.write(f"    {result.error}")

    def keep(self, sandbox) -> None:
        self.stdout.write(f"The sandbox keeps running at {sandbox.url}")
        self.stdout.write(f"kubeconfig: {sandbox.kubeconfig_path}")
        self.stdout.write("Press Ctrl-C to stop it.")
        self.stdout.flush()
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            self.stdout.write("")
