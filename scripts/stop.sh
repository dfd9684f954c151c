#!/usr/bin/env bash
# Stop the process whose id is the first line of PIDFILE and return once it has exited:
# SIGNAL (default TERM), then SIGKILL after 10 seconds. With NAMED, only a process whose
# command line holds that word: a file left by one that ended may name another process since.
#   scripts/stop.sh var/sandbox/pid
#   scripts/stop.sh var/postgres/postmaster.pid INT   # PostgreSQL's fast shutdown
#   scripts/stop.sh var/honcho.pid INT honcho          # make run's processes
set -euo pipefail

pidfile="$1"
signal="${2:-TERM}"
named="${3:-}"
[ -f "$pidfile" ] || exit 0
pid="$(head -n 1 "$pidfile")"

# A zombie (exited, not yet reaped by its parent) counts as gone.
alive() { case "$(ps -o stat= -p "$pid" 2>/dev/null)" in "" | Z*) return 1 ;; esac; }

alive || exit 0
if [ -n "$named" ]; then
  case " $(ps -o args= -p "$pid" 2>/dev/null) " in *"$named"*) ;; *) exit 0 ;; esac
fi
kill -"$signal" "$pid" 2>/dev/null || exit 0
for _ in $(seq 1 100); do
  alive || exit 0
  sleep 0.1
done
echo "process $pid ($pidfile) did not stop within 10 s: killing it" >&2
kill -KILL "$pid" 2>/dev/null || true
for _ in $(seq 1 20); do
  alive || exit 0
  sleep 0.1
done
