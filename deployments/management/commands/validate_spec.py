"""`manage.py validate_spec FILE…`: check service plan spec files before they are loaded."""

from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from deployments.spec import validate


def unreadable(exc: Exception) -> str:
    """Why a file could not be read, in one line."""
    if isinstance(exc, UnicodeDecodeError):
        return "cannot read the file: it is not UTF-8 text"
    return f"cannot read the file: {getattr(exc, 'strerror', None) or exc}"


class Command(BaseCommand):
    help = (
        "Validate service plan spec files. Prints 'FILE: ok' and its warnings, or one line per "
        "error; exits 1 when any file has errors."
    )
    # No database and no system checks: only the spec engine runs.
    requires_system_checks = []

    def add_arguments(self, parser):
        parser.add_argument("files", nargs="+", metavar="FILE", help="a spec file (YAML)")

    def handle(self, *args, **options):
        files = options["files"]
        invalid = 0
        for path in files:
            try:
                result = validate(Path(path).read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError) as exc:
                errors, warnings = [unreadable(exc)], []
            else:
                errors, warnings = result.errors, result.warnings
            if errors:
                invalid += 1
                for error in errors:
                    self.stdout.write(f"{path}: {error}")
                continue
            self.stdout.write(f"{path}: ok")
            for warning in warnings:
                self.stdout.write(f"  warning: {warning}")
        if invalid:
            raise CommandError(f"{invalid} of {len(files)} spec file(s) have errors.")
