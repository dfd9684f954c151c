"""`python -m stripe_emulator serve --port 12111 ...`: run the emulator in the foreground."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading

from .api import StripeEmulator


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
            webhook_url=args.webhook_url,
            webhook_secret=args.webhook_secret,
        )
    except ValueError as exc:
        parser.error(str(exc))
    emulator.start()
    print(emulator.url, flush=True)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())
    done.wait()
    emulator.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
