"""`python -m stripe_emulator serve --port 12111 ...`: run the emulator in the foreground."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading

from .api import StripeEmulator
from .persistence import StateFileError


def main(argv: list[str] | None = None) -> int:
    """Parse the command line, print the URL on one line, and serve until interrupted."""
    parser = argparse.ArgumentParser(prog="python -m stripe_emulator")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve Stripe's API on loopback (plain HTTP)")
    serve.add_argument("--port", type=int, default=12111)
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--api-key", help="accept only this sk_test_ key (default: any)")
    serve.add_argument("--webhook-url", help="deliver events here")
    serve.add_argument("--webhook-secret", help="sign them with this whsec_ secret")
    serve.add_argument(
        "--webhook-retries", type=int, default=3, help="attempts after a failed delivery (3)"
    )
    serve.add_argument(
        "--webhook-retry-delay",
        type=float,
        default=0.5,
        help="seconds before the first retry, doubling after each (0.5)",
    )
    serve.add_argument(
        "--state", metavar="FILE", help="keep the state in FILE across restarts (JSON)"
    )
    serve.add_argument(
        "--auto-bill",
        action="store_true",
        help="close ended periods, finalize drafts after an hour and charge open invoices "
        "as the emulator's clock passes",
    )
    serve.add_argument(
        "--auto-bill-interval",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="how often --auto-bill looks (5)",
    )
    serve.add_argument("--log-level", default="WARNING")
    args = parser.parse_args(argv)

    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    if bool(args.webhook_url) != bool(args.webhook_secret):
        parser.error("--webhook-url and --webhook-secret go together")
    try:
        emulator = StripeEmulator(
            args.host,
            args.port,
            api_key=args.api_key,
            state_file=args.state,
            auto_bill=args.auto_bill,
            auto_bill_interval=args.auto_bill_interval,
        )
        if args.webhook_url:
            emulator.set_webhook(
                args.webhook_url,
                args.webhook_secret,
                retries=args.webhook_retries,
                retry_delay=args.webhook_retry_delay,
            )
    except StateFileError as exc:
        print(f"python -m stripe_emulator: {exc}", file=sys.stderr)
        return 1
    except ValueError as exc:
        parser.error(str(exc))
    try:
        emulator.start()
    except OSError as exc:
        print(
            f"python -m stripe_emulator: cannot serve on {args.host}:{args.port}: {exc}",
            file=sys.stderr,
        )
        return 1
    print(emulator.url, flush=True)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())
    done.wait()
    emulator.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
