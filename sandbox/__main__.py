"""`python -m sandbox serve --port 6443 ...`: run the sandbox cluster in the foreground.

`python -m sandbox fail-pod NAMESPACE/POD [--seconds 60 | --until-cleared | --clear]` fails a pod
of a running sandbox through its control endpoint.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
import urllib.error
import urllib.request

from .api import Sandbox
from .faults import parse_spec


def main(argv: list[str] | None = None) -> int:
    """Parse the command line and serve until interrupted."""
    parser = argparse.ArgumentParser(prog="python -m sandbox")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve the Kubernetes API on loopback (plain HTTP)")
    serve.add_argument("--port", type=int, default=6443)
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--state", help="JSON file persisting objects and the object store")
    serve.add_argument("--speed", type=float, default=1.0, help="divide simulated durations by X")
    serve.add_argument("--faults", help='e.g. "500=0.05,429=0.1,latency=20ms,conflict=0.1"')
    serve.add_argument("--kubeconfig-out", help="write a kubeconfig for this server here")
    serve.add_argument("--token", help="require this bearer token")
    serve.add_argument("--log-level", default="INFO")
    fail = sub.add_parser("fail-pod", help="crash a pod's containers in a running sandbox")
    fail.add_argument("pod", help="NAMESPACE/POD")
    fail.add_argument("--seconds", type=float, default=60.0, help="how long (real seconds)")
    fail.add_argument("--until-cleared", action="store_true", help="until --clear")
    fail.add_argument("--clear", action="store_true", help="end the failure now")
    fail.add_argument("--url", default="http://127.0.0.1:6443", help="the sandbox's address")
    args = parser.parse_args(argv)
    if args.command == "fail-pod":
        return _fail_pod(parser, args)

    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    if args.speed <= 0:
        parser.error("--speed must be positive")
    try:
        faults = parse_spec(args.faults)
        sandbox = Sandbox(
            host=args.host, port=args.port, speed=args.speed, state=args.state, token=args.token
        )
        sandbox.faults.update(faults)
    except ValueError as exc:
        parser.error(str(exc))
    sandbox.start()
    if args.kubeconfig_out:
        path = sandbox.write_kubeconfig(args.kubeconfig_out)
        logging.getLogger("sandbox").info("kubeconfig written to %s", path)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())
    saver = threading.Thread(target=_autosave, args=(sandbox, done), daemon=True)
    saver.start()
    done.wait()
    sandbox.stop()
    return 0


def _fail_pod(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    namespace, _, pod = args.pod.partition("/")
    if not namespace or not pod:
        parser.error("the pod is NAMESPACE/POD")
    if args.seconds <= 0:
        parser.error("--seconds must be positive")
    body = None if args.clear else {"seconds": None if args.until_cleared else args.seconds}
    request = urllib.request.Request(  # noqa: S310 - the sandbox's own control endpoint
        f"{args.url.rstrip('/')}/sandbox/v1/namespaces/{namespace}/pods/{pod}/fail",
        data=json.dumps(body).encode() if body is not None else None,
        method="DELETE" if args.clear else "POST",
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310
            print(response.read().decode())
    except urllib.error.HTTPError as err:
        print(err.read().decode(), file=sys.stderr)
        return 1
    except urllib.error.URLError as err:
        print(f"cannot reach the sandbox at {args.url}: {err.reason}", file=sys.stderr)
        return 1
    return 0


def _autosave(sandbox: Sandbox, done: threading.Event) -> None:
    # Persist every couple of seconds so a crash loses little.
    while not done.wait(2.0):
        sandbox.save()


if __name__ == "__main__":
    sys.exit(main())
