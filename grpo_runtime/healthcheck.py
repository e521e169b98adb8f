"""Exit 0 when a gRPC server reports SERVING: the containers' HEALTHCHECK.

``python -m grpo_runtime.healthcheck --port 50051 [--service grpo.reward.v1.RewardService]``
"""

from __future__ import annotations

import argparse
import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


def check(target: str, service: str = "", timeout_s: float = 3.0) -> bool:
    """True when ``target`` answers the health check of ``service`` with SERVING."""
    with grpc.insecure_channel(target) as channel:
        try:
            response = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=timeout_s
            )
        except grpc.RpcError as error:
            print(f"{target}: {error.code().name} {error.details()}", file=sys.stderr)
            return False
    serving = response.status == health_pb2.HealthCheckResponse.SERVING
    if not serving:
        print(
            f"{target}: {health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)}", file=sys.stderr
        )
    return serving


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--service", default="", help='service name; "" = the whole server')
    parser.add_argument("--timeout", type=float, default=3.0, help="seconds")
    args = parser.parse_args(argv)
    return 0 if check(f"{args.host}:{args.port}", args.service, args.timeout) else 1


if __name__ == "__main__":
    sys.exit(main())
