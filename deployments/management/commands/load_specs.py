from pathlib import Path

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from deployments import services
from deployments.spec.loader import SpecError


class Command(BaseCommand):
    help = (
        "Create or update the plans that spec files describe. A changed spec adds a plan "
        "version; an unchanged one changes nothing. A new plan or version is refused while a "
        "registered cell its instances may run on lacks what it needs (the kinds its workflows "
        "write, a backup destination it reads). Directories are searched for *.yaml."
    )

    def add_arguments(self, parser):
        parser.add_argument("paths", nargs="+", help="spec files or directories")

    def handle(self, *args, paths, **options):
        files: list[Path] = []
        for raw in paths:
            path = Path(raw)
            if path.is_dir():
                files += sorted([*path.glob("*.yaml"), *path.glob("*.yml")])
            elif path.is_file():
                files.append(path)
            else:
                raise CommandError(f"{raw}: no such file or directory")
        failed = False
        for path in files:
            try:
                result = services.plan_load(text=path.read_text())
            except SpecError as exc:
                failed = True
                for error in exc.errors:
                    self.stderr.write(f"{path}: {error}")
                continue
            except ValidationError as exc:  # a registered cell cannot run it
                failed = True
                for message in exc.messages:
                    self.stderr.write(f"{path}: {message}")
                continue
            except (OSError, UnicodeDecodeError) as exc:
                failed = True
                self.stderr.write(f"{path}: cannot be read: {exc}")
                continue
            plan, version = result.plan, result.version
            if result.version_created:
                what = "created" if version.number == 1 else f"updated to version {version.number}"
                if result.same_as is not None:
                    what += f" (the text of version {result.same_as.number})"
            elif result.plan_changed:
                what = f"details updated (version {version.number} unchanged)"
            else:
                what = f"unchanged (version {version.number})"
            self.stdout.write(f"{path}: plan {plan.key} {what}")
            for warning in result.warnings:
                self.stdout.write(f"  warning: {warning}")
        if failed:
            raise CommandError("some specs were not loaded")
