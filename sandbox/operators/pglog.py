"""PostgreSQL log lines as CloudNativePG's instance manager writes them: one JSON object a line.

The instance manager logs its own messages (`logger` `instance-manager`, `backup`, ...) and wraps
every PostgreSQL log record (`logger` `postgres`, `msg` `record`) with the csvlog fields under
`record`. The functions here return the lines of one simulated moment of an instance's life.
"""

from __future__ import annotations

import datetime as dt
import json
import time
import zlib
from typing import Any

from ..logs import rfc3339_nano

OPERATOR_VERSION = "1.28.0"
# The release each major version's image runs (its tag, `postgresql:17`, names only the major).
PG_RELEASES = {
    "13": "13.22",
    "14": "14.19",
    "15": "15.14",
    "16": "16.10",
    "17": "17.6",
    "18": "18.1",
}


def pg_version(image: str) -> str:
    """The PostgreSQL version the image runs, as its start line prints it."""
    name = image.rsplit("/", 1)[-1]
    tag = name.split(":", 1)[1] if ":" in name else ""
    major = tag.split(".", 1)[0].split("-", 1)[0]
    release = PG_RELEASES.get(major) or tag or PG_RELEASES["18"]
    return f"{release} (Debian {release}-1.pgdg13+1)"


class InstanceLog:
    """Builds the log lines of one instance (pod) of a Cluster."""

    def __init__(self, pod: str, image: str = "") -> None:
        self.pod = pod
        self.version = pg_version(image)  # what the pod's image runs
        # Stable, plausible process ids per pod: postmaster, checkpointer, startup, walreceiver.
        base = 20 + zlib.crc32(pod.encode()) % 40
        self.pids = {
            "postmaster": base,
            "checkpointer": base + 2,
            "startup": base + 4,
            "walreceiver": base + 9,
            "walsender": base + 31,
            "client backend": base + 57,
        }

    def _line(
        self, when: float, logger: str, msg: str, extra: dict[str, Any], level: str = "info"
    ) -> str:
        # zap's field order and compact encoding, as the instance manager prints them.
        line = {"level": level, "ts": rfc3339_nano(int(when * 1e9)), "logger": logger, "msg": msg}
        line.update({"logging_pod": self.pod, **extra})
        return json.dumps(line, separators=(",", ":"))

    def manager(
        self, message: str, *, level: str = "info", logger: str = "instance-manager", **extra: Any
    ) -> str:
        """A line of the instance manager itself."""
        return self._line(time.time(), logger, message, extra, level)

    def record(
        self,
        message: str,
        *,
        backend: str = "postmaster",
        severity: str = "LOG",
        when: float | None = None,
    ) -> str:
        """A PostgreSQL log record, wrapped as the instance manager forwards it."""
        when = when or time.time()
        moment = dt.datetime.fromtimestamp(when, dt.UTC)
        pid = self.pids.get(backend, self.pids["postmaster"])
        millis = f"{moment.microsecond // 1000:03d}"
        record = {
            "log_time": moment.strftime("%Y-%m-%d %H:%M:%S.") + f"{millis} UTC",
            "process_id": str(pid),
            "session_id": f"{int(when) - 60:x}.{pid:x}",
            "session_line_num": "1",
            "session_start_time": moment.strftime("%Y-%m-%d %H:%M:%S UTC"),
            "transaction_id": "0",
            "error_severity": severity,
            "sql_state_code": "00000" if severity in ("LOG", "INFO") else "XX000",
            "message": message,
            "backend_type": backend,
            "query_id": "0",
        }
        return self._line(when, "postgres", "record", {"record": record})

    # ---- moments ---------------------------------------------------------------------------

    def manager_start(self) -> list[str]:
        """The instance manager starts in a new container."""
        return [
            self.manager(
                "Starting CloudNativePG Instance Manager",
                logger="setup",
                version=OPERATOR_VERSION,
                build={"Version": OPERATOR_VERSION, "Commit": "sandbox", "Date": "2026-01-01"},
            ),
            self.manager("Checking for free disk space for WALs before starting PostgreSQL"),
            self.manager("starting tablespace manager", logger="tbs_reconciler"),
        ]

    def _postgres_start(self) -> list[str]:
        return [
            self.record(
                f"starting PostgreSQL {self.version} on x86_64-pc-linux-gnu, compiled by gcc "
                "(Debian 14.2.0-19) 14.2.0, 64-bit"
            ),
            self.record('listening on IPv4 address "0.0.0.0", port 5432'),
            self.record('listening on IPv6 address "::", port 5432'),
            self.record('listening on Unix socket "/controller/run/.s.PGSQL.5432"'),
        ]

    def primary_ready(self, *, crashed: bool = False) -> list[str]:
        """PostgreSQL starts as the primary (after a clean stop, or a crash)."""
        stamp = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(time.time() - 5))
        if crashed:
            middle = [
                self.record(
                    f"database system was interrupted; last known up at {stamp}", backend="startup"
                ),
                self.record(
                    "database system was not properly shut down; automatic recovery in progress",
                    backend="startup",
                ),
                self.record(f"redo starts at {_lsn(0)}", backend="startup"),
                self.record(f"redo done at {_lsn(1)}", backend="startup"),
            ]
        else:
            middle = [self.record(f"database system was shut down at {stamp}", backend="startup")]
        return [
            *self._postgres_start(),
            *middle,
            self.record("database system is ready to accept connections"),
        ]

    def replica_ready(self, primary: str, timeline: int) -> list[str]:
        """PostgreSQL starts as a streaming replica of primary."""
        return [
            *self._postgres_start(),
            self.record("entering standby mode", backend="startup"),
            self.record(f"redo starts at {_lsn(0)}", backend="startup"),
            self.record(f"consistent recovery state reached at {_lsn(1)}", backend="startup"),
            self.record("database system is ready to accept read-only connections"),
            self.record(
                f"started streaming WAL from primary at {_lsn(0, 0)} on timeline {timeline}",
                backend="walreceiver",
            ),
            self.manager("replication connected", logger="instance-manager", primary=primary),
        ]

    def replica_connected(self, replica: str) -> list[str]:
        """On the primary: a replica's WAL sender connection."""
        return [
            self.record(
                f"replication connection authorized: user=streaming_replica "
                f"application_name={replica} SSL enabled (protocol=TLSv1.3, "
                "cipher=TLS_AES_256_GCM_SHA384, bits=256)",
                backend="walsender",
            )
        ]

    def checkpoint(self, when: float, replica: bool = False) -> list[str]:
        """A timed checkpoint (a restartpoint on a replica)."""
        kind = "restartpoint" if replica else "checkpoint"
        buffers = 3 + zlib.crc32(f"{self.pod}{int(when)}".encode()) % 60
        lines = [
            self.record(f"{kind} starting: time", backend="checkpointer", when=when),
            self.record(
                f"{kind} complete: wrote {buffers} buffers ({buffers / 163.84:.1f}%), "
                "wrote 3 SLRU buffers; 0 WAL file(s) added, 0 removed, 1 recycled; "
                f"write={buffers * 0.1:.3f} s, sync=0.004 s, total={buffers * 0.1 + 0.012:.3f} s; "
                f"sync files={buffers // 3 + 1}, longest=0.002 s, average=0.001 s; "
                f"distance={buffers * 8} kB, estimate={buffers * 8 + 40} kB; "
                f"lsn={_lsn(2, when)}, redo lsn={_lsn(1, when)}",
                backend="checkpointer",
                when=when + 0.01,
            ),
        ]
        if replica:
            lines.append(
                self.record(
                    f"recovery restart point at {_lsn(1, when)}",
                    backend="checkpointer",
                    when=when + 0.02,
                )
            )
        return lines

    def shutdown(self) -> list[str]:
        """A fast shutdown (switchover, restart, hibernation)."""
        return [
            self.manager("Requesting fast shutdown of the PostgreSQL instance"),
            self.record("received fast shutdown request"),
            self.record("aborting any active transactions"),
            self.record(
                'background worker "logical replication launcher" (PID '
                f"{self.pids['postmaster'] + 6}) exited with exit code 1"
            ),
            self.record("shutting down", backend="checkpointer"),
            self.record("checkpoint starting: shutdown immediate", backend="checkpointer"),
            self.record("database system is shut down"),
        ]

    def promoted(self, timeline: int) -> list[str]:
        """A replica becomes the primary."""
        return [
            self.manager("I'm the target primary, promoting my instance"),
            self.record("received promote request", backend="startup"),
            self.record(
                "terminating walreceiver process due to administrator command",
                backend="walreceiver",
                severity="FATAL",
            ),
            self.record(f"redo done at {_lsn(1)}", backend="startup"),
            self.record(f"selected new timeline ID: {timeline}", backend="startup"),
            self.record("archive recovery complete", backend="startup"),
            self.record("database system is ready to accept connections"),
        ]

    def reload(self) -> list[str]:
        """The configuration changed."""
        return [
            self.manager("Reloading the PostgreSQL configuration"),
            self.record("received SIGHUP, reloading configuration files"),
        ]

    def crash(self) -> list[str]:
        """PostgreSQL dies (a fault the sandbox injected)."""
        return [
            self.record(
                f"server process (PID {self.pids['client backend']}) was terminated by "
                "signal 9: Killed"
            ),
            self.record("terminating any other active server processes"),
            self.manager(
                "PostgreSQL process exited with errors",
                level="error",
                error="signal: killed (injected by the sandbox)",
            ),
        ]

    def backup_started(self, backup: str, namespace: str) -> list[str]:
        """A Barman Cloud backup starts on this (primary) instance."""
        return [
            self.manager(
                "Starting barman-cloud-backup",
                logger="backup",
                backupName=backup,
                backupNamespace=namespace,
            ),
            self.record("checkpoint starting: force wait", backend="checkpointer"),
            self.record("checkpoint complete: wrote 0 buffers (0.0%)", backend="checkpointer"),
        ]

    def backup_finished(self, backup: str, namespace: str, error: str = "") -> list[str]:
        """The backup ends."""
        if error:
            return [
                self.manager(
                    "Backup failed",
                    logger="backup",
                    level="error",
                    backupName=backup,
                    backupNamespace=namespace,
                    error=error,
                )
            ]
        return [
            self.manager(
                "Backup completed", logger="backup", backupName=backup, backupNamespace=namespace
            ),
        ]


def _lsn(step: int, when: float | None = None) -> str:
    """A plausible WAL location that moves forward with time."""
    base = int((when or time.time()) * 16) & 0xFFFFFF
    return f"0/{(base << 8) + step * 0x28:X}"
