"""`--state FILE`: the emulator's state in one JSON file, so a restarted emulator still knows
the customers, prices and subscriptions its clients stored the ids of.

Kept: objects (events too), accepted meter events, saved idempotency responses (Stripe keeps
them for 24 hours whether or not it restarts), the invoice counter and the clock offset. Not
kept: recorded requests, delivery attempts, faults and the webhook endpoint, which are the
running process's business.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from .idempotency import IdempotencyKeys
from .state import MeterEvent, State

FORMAT = "stripe-emulator-state"
VERSION = 1


class StateFileError(Exception):
    """A state file that cannot be read, or is not the emulator's."""


def state_dump(state: State, idempotency: IdempotencyKeys) -> dict[str, Any]:
    """The JSON-ready snapshot; called under the state lock."""
    return {
        "format": FORMAT,
        "version": VERSION,
        "clock_offset": state.clock_offset,
        "invoice_numbers": state.invoice_numbers,
        "objects": state.objects,
        "meter_events": [event.to_dict() for event in state.meter_events],
        "idempotency": idempotency.to_list(state.now()),
    }


def state_load(path: Path, state: State, idempotency: IdempotencyKeys) -> None:
    """Fill an empty state from path; a missing file leaves it empty. StateFileError when the
    file cannot be read or does not hold the emulator's state."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return
    except (OSError, UnicodeDecodeError) as exc:
        raise StateFileError(f"cannot read the state file {path}: {exc}") from None
    try:
        data = json.loads(text)
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ValueError("not a Stripe emulator state file")
        if data.get("version") != VERSION:
            raise ValueError(f"version {data.get('version')!r}, this emulator reads {VERSION}")
        objects = data["objects"]
        if not isinstance(objects, dict) or not all(isinstance(v, dict) for v in objects.values()):
            raise ValueError("objects is not a mapping of kinds to objects")
        meter_events = [MeterEvent(**event) for event in data["meter_events"]]
        clock_offset, invoice_numbers = int(data["clock_offset"]), int(data["invoice_numbers"])
        idempotency.load_list(data["idempotency"])  # all or nothing
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        reason = f"missing {exc}" if isinstance(exc, KeyError) else str(exc)
        raise StateFileError(f"the state file {path} is unreadable: {reason}") from None
    state.objects = objects
    state.meter_events = meter_events
    state.clock_offset = clock_offset
    state.invoice_numbers = invoice_numbers


def state_save(path: Path, snapshot: dict[str, Any]) -> None:
    """Write the snapshot atomically: a temporary file beside path (owner-only), then a
    rename, so a crash leaves the previous file or the new one, never half of one."""
    temporary = path.with_name(f".{path.name}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        json.dump(snapshot, out, separators=(",", ":"))
        out.flush()
        os.fsync(out.fileno())
    os.replace(temporary, path)
