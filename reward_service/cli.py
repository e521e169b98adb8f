"""``python -m reward_service stress CONFIG.yaml [--target HOST:PORT]``: the reward-hacking check.

CONFIG is a StressRewardRequest in YAML (protobuf JSON names)::

    rewards:
      - {name: accuracy}
      - {name: format, weight: 0.5}
    samples:                                  # reference samples: prompt + metadata (+ a genuine completion)
      - prompt: [{role: user, content: "What is 2 + 2? Answer in \\\\boxed{}."}]
        metadata: {answer: "4"}
        completion: "<think>\\n2 + 2 = 4\\n</think>\\n<answer>\\n\\\\boxed{4}\\n</answer>"
    threshold: 0.75                           # optional (default: the middle of the reward range)
    attacks: [empty, format_only]             # optional (default: all)

With ``--target`` the running service's StressReward RPC answers; without it the rewards are scored in this
process by a reward service built from ``--settings`` (the service's ``--config`` file; rule rewards only
unless it preloads models). Prints one line per attack (``--json``: the StressRewardResponse as JSON).

Exit codes: 0 when no attack reaches the threshold, 1 when one does, 2 for a bad config or a refused request.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Sequence
from pathlib import Path

import grpc
from google.protobuf import json_format
from grpo.reward.v1 import reward_pb2, reward_pb2_grpc

from grpo_runtime.client import ChannelConfig, create_sync_channel
from grpo_runtime.config import ConfigError, load_config_file, safe_load_yaml
from grpo_runtime.errors import ServiceError
from reward_service.server import start_reward_service
from reward_service.settings import load_settings

PROG = "reward_service stress"


def _request(path: Path, threshold: float | None) -> reward_pb2.StressRewardRequest:
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}") from exc
    data = safe_load_yaml(text, what=str(path)) or {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping (rewards, samples, ...)")
    try:
        request = json_format.ParseDict(data, reward_pb2.StressRewardRequest())
    except json_format.ParseError as exc:
        raise ConfigError(f"{path}: {exc}") from exc
    if threshold is not None:
        request.threshold = threshold
    return request


def _remote(target: str, request: reward_pb2.StressRewardRequest, timeout_s: float):
    with create_sync_channel(ChannelConfig(target=target)) as channel:
        return reward_pb2_grpc.RewardServiceStub(channel).StressReward(request, timeout=timeout_s)


async def _local(settings_file: Path | None, request: reward_pb2.StressRewardRequest):
    raw = load_config_file(settings_file)[1] if settings_file is not None else {}
    service = await start_reward_service(load_settings(raw))
    try:
        [reward_binding, *_] = service.bindings()
        return await reward_binding.servicer.StressReward(request, None)
    finally:
        await service.close()


def _table(response: reward_pb2.StressRewardResponse) -> str:
    lines = [f"threshold {response.threshold:g}", f"{'attack':<26}{'max reward':>12}  flagged"]
    for attack in response.attacks:
        best = f"{attack.max_reward:.4g}" if attack.HasField("max_reward") else "-"
        lines.append(f"{attack.name:<26}{best:>12}  {'FLAGGED' if attack.flagged else ''}")
    for score in response.baseline:
        if score.id:
            value = f"{score.reward:.4g}" if score.HasField("reward") else "-"
            lines.append(f"baseline {score.id}: {value}")
    flagged = [a.name for a in response.attacks if a.flagged]
    lines.append(f"flagged: {', '.join(flagged)}" if flagged else "no attack reaches the threshold")
    return "\n".join(lines)


def stress(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog=PROG, description="Probe a reward configuration for reward hacking."
    )
    parser.add_argument(
        "config", type=Path, help="StressRewardRequest YAML: rewards, samples, threshold, attacks"
    )
    parser.add_argument("--target", help="host:port of a running reward service (default: score in-process)")
    parser.add_argument("--settings", type=Path, help="in-process: the reward service's config file")
    parser.add_argument("--threshold", type=float, help="overrides the config's threshold")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds the RPC may take (default 600)")
    parser.add_argument("--json", action="store_true", help="print the response as JSON")
    args = parser.parse_args(argv)
    try:
        request = _request(args.config, args.threshold)
        if args.target:
            response = _remote(args.target, request, args.timeout)
        else:
            response = asyncio.run(_local(args.settings, request))
    except ConfigError as exc:
        print(f"{PROG}: config error: {exc}", file=sys.stderr)
        return 2
    except ServiceError as exc:  # in-process: the servicer's domain error, as the RPC would report it
        print(f"{PROG}: {exc.code.name}: {exc.details}", file=sys.stderr)
        return 2
    except grpc.RpcError as exc:
        print(f"{PROG}: {exc.code().name}: {exc.details()}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(json_format.MessageToDict(response), indent=2))
    else:
        print(_table(response))
    return 1 if any(a.flagged for a in response.attacks) else 0
