#!/usr/bin/env bash
# The body of `make run`, run by `python -m portal.launch --dev` so that every step and the
# Procfile's processes share its environment (keys, DATABASE_URL, CELERY_BROKER_URL, …, and
# with STRIPE_EMULATOR=1 the STRIPE_* settings of the Stripe emulator it starts).
set -euo pipefail
cd "$(dirname "$0")/.."

python=.venv/bin/python
var="${OPSDECK_VAR_DIR:-var}"
step() { echo "+ $*"; "$@"; }

# STRIPE_EMULATOR=1: the Stripe emulator stands in for Stripe (refused with a STRIPE_* set).
stripe_env=""
if [ -n "${STRIPE_EMULATOR:-}" ]; then stripe_env="$(scripts/stripe_emulator.sh env)"; fi

step "$python" manage.py migrate --noinput
# The sandbox answers before the plans load: a changed spec is checked against the cell
# registered by the last start.
step scripts/sandbox.sh start
step "$python" manage.py load_specs specs/
printf '{"ACCESS_KEY_ID": "sandbox", "ACCESS_SECRET_KEY": "sandbox"}' >"$var/sandbox/credentials.json"
step "$python" manage.py add_cell --name sandbox --kubeconfig "$var/sandbox/kubeconfig" \
  --region local --cloud sandbox --backup-destination s3://sandbox/opsdeck \
  --backup-credentials "$var/sandbox/credentials.json" --default
if [ -n "$stripe_env" ]; then
  step scripts/stripe_emulator.sh start
  eval "$stripe_env"
  step "$python" manage.py stripe_sync_catalog
fi
step "$python" manage.py seed_demo
echo
echo "Opsdeck is starting at http://127.0.0.1:$PORT/ (Ctrl-C stops it)"
if [ -n "$stripe_env" ]; then echo "Stripe: the emulator at $STRIPE_API_BASE (make stop stops it)"; fi
echo
# honcho keeps this process's id: `make stop` stops it, and with it the Procfile's processes,
# when it runs in the background or in another terminal.
echo $$ >"$var/honcho.pid"
PATH="$PWD/.venv/bin:$PATH" exec .venv/bin/honcho start --procfile Procfile --port "$PORT"
