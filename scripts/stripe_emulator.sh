#!/usr/bin/env bash
# The Stripe emulator that `STRIPE_EMULATOR=1 make run` uses instead of Stripe.
#   scripts/stripe_emulator.sh start   # in the background; waits until it answers
#   scripts/stripe_emulator.sh stop    # returns once it has exited (nothing to do if not running)
#   eval "$(scripts/stripe_emulator.sh env)"   # export the STRIPE_* settings that point at it
#   scripts/stripe_emulator.sh running         # exit status 0 when it runs
# Its test API key and webhook secret are generated once into var/stripe/ (mode 600), its
# objects kept in var/stripe/state.json across restarts, its webhooks sent to the portal on
# $PORT. --auto-bill closes periods and charges invoices as its clock passes (README.md).
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
dir="${OPSDECK_VAR_DIR:-$root/var}/stripe"
python="$root/.venv/bin/python"

running() { [ -f "$dir/pid" ] && kill -0 "$(cat "$dir/pid")" 2>/dev/null; }

# The port asked for; else, while it runs, the port it was started on (kept in $dir/port, so
# that `env` in another shell finds it); else 12111.
port="${STRIPE_EMULATOR_PORT:-}"
if [ -z "$port" ] && running && [ -s "$dir/port" ]; then port="$(cat "$dir/port")"; fi
port="${port:-12111}"

# The content of $dir/NAME, made once as PREFIX + random hex, readable by its owner only.
secret() {
  local file="$dir/$1"
  if [ ! -s "$file" ]; then
    mkdir -p "$dir"
    (umask 077 && "$python" -c 'import secrets, sys; print(sys.argv[1] + secrets.token_hex(24))' \
      "$2" >"$file.tmp" && mv "$file.tmp" "$file")
  fi
  chmod 600 "$file"
  cat "$file"
}

case "${1:-}" in
  env)
    if [ "${STRIPE_EMULATOR:-1}" != 1 ]; then
      echo "STRIPE_EMULATOR is 1 (use the Stripe emulator) or unset, not '$STRIPE_EMULATOR'" >&2
      exit 2
    fi
    for name in STRIPE_API_KEY STRIPE_WEBHOOK_SECRET STRIPE_API_BASE; do
      if [ -n "${!name:-}" ]; then
        echo "STRIPE_EMULATOR=1 brings its own Stripe settings: unset $name or STRIPE_EMULATOR" >&2
        exit 2
      fi
    done
    echo "export STRIPE_API_KEY=$(secret api_key sk_test_)"
    echo "export STRIPE_WEBHOOK_SECRET=$(secret webhook_secret whsec_)"
    echo "export STRIPE_API_BASE=http://127.0.0.1:$port"
    ;;
  start)
    if running; then
      echo "Stripe emulator already running (pid $(cat "$dir/pid"))"
      exit 0
    fi
    mkdir -p "$dir"
    api_key="$(secret api_key sk_test_)"
    webhook_secret="$(secret webhook_secret whsec_)"
    url="http://127.0.0.1:$port"
    cd "$root"
    # A session of its own where there is setsid: Ctrl-C on `make run` leaves it to `make stop`.
    session=""
    if command -v setsid >/dev/null 2>&1; then session=setsid; fi
    # Retries 2 s apart, doubling, for about four minutes: the portal starts after it.
    nohup $session "$python" -m stripe_emulator serve --port "$port" --api-key "$api_key" \
      --webhook-url "http://127.0.0.1:${PORT:-8000}/billing/stripe/webhook/" \
      --webhook-secret "$webhook_secret" --webhook-retries 7 --webhook-retry-delay 2 \
      --state "$dir/state.json" --auto-bill --log-level INFO >"$dir/log" 2>&1 &
    echo $! >"$dir/pid"
    echo "$port" >"$dir/port"
    for _ in $(seq 1 100); do
      # It prints its URL once it listens.
      if grep -qxF "$url" "$dir/log" && (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
        echo "Stripe emulator on $url (log: $dir/log)"
        exit 0
      fi
      running || break
      sleep 0.1
    done
    "$root/scripts/stop.sh" "$dir/pid"
    rm -f "$dir/pid" "$dir/port"
    echo "the Stripe emulator did not start on port $port; the end of $dir/log:" >&2
    tail -n 3 "$dir/log" >&2
    exit 1
    ;;
  stop)
    if running; then "$root/scripts/stop.sh" "$dir/pid"; fi
    rm -f "$dir/pid" "$dir/port"
    ;;
  running)
    running
    ;;
  *)
    echo "usage: $0 start|stop|env|running" >&2
    exit 2
    ;;
esac
