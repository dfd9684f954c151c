#!/usr/bin/env bash
# Start or stop the sandbox cluster that `make run` uses as its default cell.
#   scripts/sandbox.sh start   # in the background; waits until it answers
#   scripts/sandbox.sh stop    # returns once it has exited
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
dir="${OPSDECK_VAR_DIR:-$root/var}/sandbox"
port="${SANDBOX_PORT:-6443}"
python="$root/.venv/bin/python"
mkdir -p "$dir"

running() { [ -f "$dir/pid" ] && kill -0 "$(cat "$dir/pid")" 2>/dev/null; }

case "${1:-}" in
  start)
    if running; then
      echo "sandbox cluster already running (pid $(cat "$dir/pid"))"
      exit 0
    fi
    rm -f "$dir/kubeconfig"
    cd "$root"
    # A session of its own where there is setsid: Ctrl-C on `make run` leaves it to `make stop`.
    session=""
    if command -v setsid >/dev/null 2>&1; then session=setsid; fi
    nohup $session "$python" -m sandbox serve --port "$port" \
      --state "$dir/state.json" --kubeconfig-out "$dir/kubeconfig" >"$dir/log" 2>&1 &
    echo $! >"$dir/pid"
    for _ in $(seq 1 100); do
      [ -s "$dir/kubeconfig" ] && { echo "sandbox cluster on http://127.0.0.1:$port (log: $dir/log)"; exit 0; }
      running || break
      sleep 0.1
    done
    echo "the sandbox cluster did not start; see $dir/log" >&2
    exit 1
    ;;
  stop)
    if running; then "$root/scripts/stop.sh" "$dir/pid"; fi
    rm -f "$dir/pid"
    ;;
  *)
    echo "usage: $0 start|stop" >&2
    exit 2
    ;;
esac
