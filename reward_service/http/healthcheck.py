"""Exit 0 when the reward service answers on both its ports: gRPC health SERVING and ``GET /health`` on the
HTTP port 200 with ``"status": "SERVING"``. The container healthcheck when ``--http-port`` is on (the
compose.http.yaml override), so a reward container whose HTTP endpoint does not answer is unhealthy.

``python -m reward_service.http.healthcheck --port 50051 --http-port 5000``
"""

from __future__ import annotations

import argparse
import http.client
import json
import sys
import urllib.error
import urllib.request

from grpo_runtime.healthcheck import check

MAX_HEALTH_BYTES = 4096  # /health answers a few dozen bytes; more is not this endpoint


def check_http(host: str, port: int, timeout_s: float = 3.0) -> bool:
    """True when ``http://host:port/health`` answers 200 with ``"status": "SERVING"``; the reason on stderr
    otherwise."""
    url = f"http://{host}:{port}/health"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            status = json.loads(response.read(MAX_HEALTH_BYTES)).get("status")
    # URLError and HTTPError are OSErrors; HTTPException: a server that does not speak HTTP/1 (gRPC's port).
    except (OSError, http.client.HTTPException, ValueError, AttributeError) as error:
        print(f"{url}: {error}", file=sys.stderr)
        return False
    if status != "SERVING":
        print(f"{url}: status {status!r}", file=sys.stderr)
        return False
    return True


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True, help="gRPC port")
    parser.add_argument("--http-port", type=int, required=True, help="HTTP (OpenRLHF) port")
    parser.add_argument("--timeout", type=float, default=3.0, help="seconds, for each of the two checks")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    serving = check(f"{args.host}:{args.port}", timeout_s=args.timeout)
    return 0 if serving and check_http(args.host, args.http_port, args.timeout) else 1


if __name__ == "__main__":
    sys.exit(main())
