"""`scripts/stripe_emulator.sh`, which `STRIPE_EMULATOR=1 make run` and `make stop` use, and
`scripts/run.sh`'s refusal of a Stripe key set beside STRIPE_EMULATOR=1."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import stripe

from stripe_emulator import API_VERSION

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "stripe_emulator.sh"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def env(tmp_path) -> Iterator[dict[str, str]]:
    """The script's environment: its own var/ and ports; stopped at the end whatever happened."""
    env = {
        **os.environ,
        "OPSDECK_VAR_DIR": str(tmp_path / "var"),
        "STRIPE_EMULATOR_PORT": str(_free_port()),
        "PORT": str(_free_port()),
    }
    for name in ("STRIPE_EMULATOR", "STRIPE_API_KEY", "STRIPE_WEBHOOK_SECRET", "STRIPE_API_BASE"):
        env.pop(name, None)
    yield env
    subprocess.run([SCRIPT, "stop"], env=env, check=False, timeout=30)  # noqa: S603


def _alive(pid: int) -> bool:
    """Running, as stop.sh sees it: a zombie (exited, not reaped by init yet) is gone."""
    try:
        status = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return status.rpartition(")")[2].split()[0] != "Z"


def _script(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(  # noqa: S603 - our own script
        [SCRIPT, *args], env=env, capture_output=True, text=True, timeout=30, check=False
    )


def test_start_answers_with_its_own_key_and_stop_ends_it(env):
    stripe_dir = Path(env["OPSDECK_VAR_DIR"]) / "stripe"
    url = f"http://127.0.0.1:{env['STRIPE_EMULATOR_PORT']}"

    started = _script(env, "start")
    again = _script(env, "start")

    assert started.returncode == 0, started.stderr
    assert started.stdout.startswith(f"Stripe emulator on {url} ")
    assert again.returncode == 0 and again.stdout.startswith("Stripe emulator already running")
    api_key = (stripe_dir / "api_key").read_text().strip()
    secret = (stripe_dir / "webhook_secret").read_text().strip()
    assert api_key.startswith("sk_test_") and secret.startswith("whsec_")
    for name in ("api_key", "webhook_secret"):
        assert stat.S_IMODE((stripe_dir / name).stat().st_mode) == 0o600
    client = stripe.StripeClient(api_key, stripe_version=API_VERSION, base_addresses={"api": url})
    customer = client.v1.customers.create({"email": "ada@example.com"})
    other_key = stripe.StripeClient(
        "sk_test_someone_else", stripe_version=API_VERSION, base_addresses={"api": url}
    )
    with pytest.raises(stripe.AuthenticationError):
        other_key.v1.customers.list()
    pid = int((stripe_dir / "pid").read_text())

    stopped = _script(env, "stop")

    assert stopped.returncode == 0 and not (stripe_dir / "pid").exists()
    assert not _alive(pid)
    assert _script(env, "stop").returncode == 0  # not running: nothing to do
    assert _script(env, "start").returncode == 0  # same key, same state
    assert client.v1.customers.retrieve(customer.id).email == "ada@example.com"
    exports = _script(env, "env").stdout.splitlines()
    assert exports == [
        f"export STRIPE_API_KEY={api_key}",
        f"export STRIPE_WEBHOOK_SECRET={secret}",
        f"export STRIPE_API_BASE={url}",
    ]
    # Another shell, which does not say the port (scripts/manage's), finds the one it runs on.
    elsewhere = {k: v for k, v in env.items() if k != "STRIPE_EMULATOR_PORT"}
    assert _script(elsewhere, "running").returncode == 0
    assert _script(elsewhere, "env").stdout.splitlines()[-1] == f"export STRIPE_API_BASE={url}"
    _script(env, "stop")
    assert _script(elsewhere, "running").returncode == 1


def test_a_busy_port_fails_clearly(env):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", int(env["STRIPE_EMULATOR_PORT"])))
        busy.listen()
        started = _script(env, "start")

    assert started.returncode == 1
    assert "did not start on port" in started.stderr
    assert "Address already in use" in started.stderr
    assert not (Path(env["OPSDECK_VAR_DIR"]) / "stripe" / "pid").exists()


def test_make_run_refuses_a_stripe_key_beside_the_emulator(env):
    env.update(
        STRIPE_EMULATOR="1",
        STRIPE_API_KEY="sk_live_real",
        # Were the refusal to fail, migrate would find no database rather than a real one.
        DATABASE_URL="postgres://nobody@127.0.0.1:1/none",
    )

    run = subprocess.run(  # noqa: S603 - our own script
        [ROOT / "scripts" / "run.sh"], env=env, capture_output=True, text=True, timeout=30
    )

    assert run.returncode == 2
    assert run.stderr == (
        "STRIPE_EMULATOR=1 brings its own Stripe settings: unset STRIPE_API_KEY or "
        "STRIPE_EMULATOR\n"
    )
    assert run.stdout == ""  # not one step ran
    assert not (Path(env["OPSDECK_VAR_DIR"]) / "stripe").exists()
