"""Agents through the OpenAI-compatible gateway: an OpenAI-SDK agent vs the rollout service's episode loop.

    python bench/agent_bench.py [--steps 8] [--rounds 2] [--latency-rounds 8] [--sdk-rounds 20]
                                [--shape large] [--out bench/results/agents.json]

One reward service and one HF-engine rollout service on 127.0.0.1, the rollout service started as users
start it for agents (``--openai-port``), its episodes' default environment the reward service's (as
``start_local_services(environment="reward")`` sets it). Policy ``models/tools``, data
``data/tools/train.jsonl`` (``What is 347 + 582?``), reward ``accuracy`` with ``mode: numeric`` alone.
``--shape large`` instead warm-starts a 21M policy of the same task here, as ``tools_e2e_bench.py --shape
large`` does (``--warm-steps``, ``--warm-batch``), and trains on its rows: the agent's CPU per call is the
same, the step's generation and training heavier.

1. Training step, same run config but for how episodes are played (same batch, ``num_generations``,
   ``max_completion_length``, temperature, LoRA, sync mode, seed; ``run_job`` in this process):

   - ``agent``: ``training.agents`` with the calculator agent of ``examples/agents/openai_sdk_agent.py``
     (``episode_player(Sampling(max_turns=2))``: a calculator call, then the answer after its result; the
     official ``openai`` SDK, ``max_tokens`` per call) served by ``grpo_runtime.agent_server.run_agent`` in
     its own process; every episode of a step at once (``max_concurrent_episodes`` = the batch), the
     agent's own reward not a term (``reward_weight: 0``), each completion held to the own loop's budget
     (``max_completion_tokens`` = ``max_completion_length``, tool results included);
   - ``agent_node``: the same agent in TypeScript, ``examples/node/agent_server.ts`` with the official
     ``openai`` npm package, in a ``node`` process as users start it, with the same sampling;
   - ``own_loop``: ``training.tools: {environment: calculator, max_tool_calling_iterations: 1}``, the
     rollout service's episode loop stepping the reward service's calculator environment (its episode reward
     not a term: ``environment_weight: 0``).

   Step time = median gap between consecutive optimizer-step ends (the run's metric events), pooled over
   ``--rounds`` rounds, the first step of each run not counted (``e2e_bench.step_gaps``); episodes/s =
   episodes per step / mean gap. Odd rounds run the modes in reverse order (ABBA); each agent's ratios
   to the own loop are ``training.<agent>_ratios`` (``paired``: per round). Comparable work:
   ``tool_calls_per_episode`` (own loop: the logged ``tools/call_frequency``; Python agent: the calls it
   made, from each episode's metadata, which the trainer does not log; Node agent: its episodes' second
   model calls, ``agents/model_calls``), ``completion_tokens_per_episode`` (``completions/mean_length``:
   the tokens after the first sampled one, tool results included), ``reward`` (mean accuracy) and the
   agent runs' ``agents/*`` counts.
   ``agent_cpu_s_per_step``: CPU seconds of the agent's process per step (psutil, user + system, over
   each run's steps). Target: agent ÷ own-loop step time <= 1.2.

2. Chat-completions latency at ``--sessions`` (32) concurrent sessions: that many gateway sessions
   (``RolloutClient.open_agent_session``), each called through a copy of the agent's ``shared_client`` at its
   base URL, all sending the agent's first request (the question of the first data row, the calculator tool,
   temperature 1, ``max_tokens`` ``--latency-max-tokens``) at once, ``--latency-rounds`` rounds (plus one
   warm-up); the seconds of each call as the SDK returns it. Baseline: the same generation in this process,
   with no HTTP, session or SDK: the same prompt token ids (the tokenizer's chat template with the tool and
   the generation prompt, as the gateway renders them; checked against the ids the gateway reports) and
   sampling, sent as 32 concurrent ``RolloutCore.generate`` calls to a core built as the service builds one
   (``build_core``: the same engine class, batch scheduler and settings). Rounds alternate the two sides
   (ABBA); p50/p99 per call (nearest rank, as in ``reward_bench.py``), each round's p50, and gateway ÷
   in-process ratios. Runs before part 1, while the service still serves the base weights as the in-process
   core does.

3. The agent's own SDK, to tell what the agent path costs from what the agent costs: CPU seconds of the
   bench process per ``chat.completions.create`` call made as the agent makes them (``--batch-size`` at
   once, ``--sdk-rounds`` times) against a server in another process that answers a reply the gateway gave
   in part 2. ``cpu_s_per_step`` = that × the agent run's calls per episode (a second call after a
   calculator call) × episodes per step; ``floor_ratio`` = (own-loop step + that) ÷ own-loop step, the ratio
   of an agent path that cost nothing but the SDK's CPU, were all of it on the step's critical path.

The results file is written whole, with the machine and the 1-minute load average at start and end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from multiprocessing import get_context
from pathlib import Path
from typing import Any, TextIO

import openai
import psutil
import torch
from aiohttp import web
from e2e_bench import source_commit, trio_run
from tools_e2e_bench import warm_start_tools_policy

from grpo_runtime.agent_server import RunEpisode, run_agent
from grpo_runtime.tokenizing import chat_token_ids
from rollout_service.client import RolloutClient
from rollout_service.server import build_core
from rollout_service.settings import RolloutSettings
from rollout_service.types import GenerateRequest, PromptInput, SamplingSpec
from trainer_service.local.launcher import (
    LocalServices,
    free_port,
    start_local_services,
    wait_serving,
)

ROOT = Path(__file__).resolve().parents[1]
# examples/ is a folder of the checkout, not an installed package (its agents run from the root, with
# ``python -m examples.agents...``); run as a script, bench/ is on sys.path and the root is not.
sys.path.insert(0, str(ROOT))

from examples.agents.calculator_task import Sampling, question_messages  # noqa: E402
from examples.agents.openai_client import shared_client  # noqa: E402
from examples.agents.openai_sdk_agent import CALCULATOR_TOOL, episode_player  # noqa: E402
from tests.support.node_env import node_server  # noqa: E402

AGENT_MODES = ("agent", "agent_node")
MODES = (*AGENT_MODES, "own_loop")
OWN_LOOP_WORK = ("tools/call_frequency", "completions/mean_length", "reward")
AGENT_WORK = ("completions/mean_length", "reward")
AGENT_COUNTS = (
    "agents/episodes",
    "agents/model_calls",
    "agents/failed_episodes",
    "agents/retried_episodes",
    "agents/prefix_mismatches",
    "agents/retokenized_tokens",
)
TARGETS = {"agent_vs_own_loop_step": 1.2}


# ------------------------------------------------------------------------------------------- services
def start_services(model: Path, log_dir: Path, stack: ExitStack) -> tuple[LocalServices, str]:
    """A reward service and a rollout service with its gateway, as a run starts them for an agent or a
    tool run (the reward service the episodes' default environment, a shared-memory weight directory),
    stopped when ``stack`` closes; returns them and the gateway's URL (the port its GetStatus reports)."""
    services = stack.enter_context(
        start_local_services(
            need_reward=True,
            need_rollout=True,
            model=model,
            log_dir=log_dir,
            environment="reward",
            gateway=True,
        )
    )
    with RolloutClient(services.rollout_target, timeout_s=30) as client:
        port = client.status().openai_port
    return services, f"http://127.0.0.1:{port}"


def counted(run_episode: RunEpisode, log: TextIO) -> RunEpisode:
    """``run_episode`` that writes each finished episode's tool calls to ``log`` (one JSON line each, flushed:
    the bench reads the file between runs)."""

    async def run(task: dict[str, Any], base_url: str, deadline: float | None):
        reward, metadata = await run_episode(task, base_url, deadline)
        log.write(json.dumps({"tool_calls": metadata["tool_calls"]}) + "\n")
        log.flush()
        return reward, metadata

    return run


def serve_agent_process(port: int, sampling: Sampling, log: Path) -> None:
    """The OpenAI-SDK calculator agent served on ``port`` until stopped (the target of a spawned process)."""
    with log.open("a") as lines:  # opened once: the agent's CPU per step should be the agent's
        asyncio.run(run_agent(counted(episode_player(sampling), lines), port=port))


def start_agent(sampling: Sampling, log: Path, stack: ExitStack) -> tuple[str, int]:
    """The agent in a spawned process of its own, stopped when ``stack`` closes; returns its address and
    process id."""
    port = free_port()
    process = get_context("spawn").Process(
        target=serve_agent_process, args=(port, sampling, log), daemon=True
    )
    process.start()

    def stop() -> None:
        process.terminate()
        process.join(10)

    stack.callback(stop)
    target = f"127.0.0.1:{port}"
    wait_serving(target, None, 120.0, "the agent")
    return target, process.pid


def start_node_agent(sampling: Sampling, stack: ExitStack) -> tuple[str, int]:
    """The TypeScript calculator agent of ``examples/node`` (the official ``openai`` npm package), started
    as the tests start it (``npm ci`` first when it is not built), with the Python agent's sampling;
    stopped when ``stack`` closes. Returns its address and process id."""
    sampling_args = ["--model", sampling.model, "--temperature", str(sampling.temperature)]
    sampling_args += ["--max-tokens", str(sampling.max_tokens), "--max-turns", str(sampling.max_turns)]
    agent = stack.enter_context(node_server("dist/agent_server.js", *sampling_args))
    return agent.address, agent.process.pid


# ------------------------------------------------------------------------------------ part 1: training
def run_config(
    mode: str, output: Path, args: argparse.Namespace, services: LocalServices, agent: str
) -> dict:
    """The run config of ``mode``: the same for all but for how episodes are played (``agent``: the
    address of the agent that plays them)."""
    training: dict[str, Any] = {
        "max_steps": args.steps,
        "logging_steps": 1,
        "seed": 0,
        "optimizer": {"learning_rate": 1e-4, "per_device_train_batch_size": args.batch_size},
        "generation": {
            "num_generations": args.num_generations,
            "max_completion_length": args.max_completion_length,
            "temperature": 1.0,
        },
        "rewards": {"reward_fn": "accuracy", "params": {"accuracy": {"mode": "numeric"}}},
        "model": {"lora": {"r": 16, "alpha": 32}},
    }
    if mode in AGENT_MODES:
        training["agents"] = {
            "target": agent,
            # Every episode of a step at once, as the own loop plays a step's episodes in one Generate.
            "max_concurrent_episodes": args.batch_size,
            # The agent's reward is the same accuracy: not a second term.
            "reward_weight": 0.0,
            # The own loop's budget over the whole completion, tool results included.
            "max_completion_tokens": args.max_completion_length,
        }
    else:
        # The calculator has no episode reward: the accuracy term alone, as on the agent's side.
        training["rewards"]["environment_weight"] = 0.0
        training["tools"] = {"environment": "calculator", "max_tool_calling_iterations": 1}
    return {
        "base": str(args.model),
        "output": str(output),
        "data": {"train": str(args.data)},
        # Both runs use the same services (the agent's gateway: the port the rollout service reports).
        "services": {"reward": services.reward_target, "rollout": services.rollout_target},
        "training": training,
    }


def bench_agent(config: dict, agent_pid: int, episodes_log: Path | None) -> dict:
    """One agent run: its step gaps, work and counts, and the agent process's CPU seconds per step. The
    tool calls come from ``episodes_log`` (the Python agent's) or, for an agent that logs none, from its
    model calls: with ``max_turns`` 2 an episode makes its second call after a calculator call."""
    done = len(episodes_log.read_text().splitlines()) if episodes_log and episodes_log.exists() else 0
    agent = psutil.Process(agent_pid)
    cpu_before = sum(agent.cpu_times()[:2])
    gaps, records = trio_run(config)
    cpu_per_step = (sum(agent.cpu_times()[:2]) - cpu_before) / config["training"]["max_steps"]
    run = {
        "gaps": gaps,
        "agent_cpu_s_per_step": [cpu_per_step],
        **{key: [r[key] for r in records if key in r] for key in (*AGENT_WORK, *AGENT_COUNTS)},
    }
    if episodes_log is not None:
        run["tool_calls"] = [
            json.loads(line)["tool_calls"] for line in episodes_log.read_text().splitlines()[done:]
        ]
    else:
        calls, episodes = sum(run["agents/model_calls"]), sum(run["agents/episodes"])
        run["tool_calls"] = [(calls - episodes) / episodes]
    return run


def bench_own_loop(config: dict) -> dict:
    gaps, records = trio_run(config)
    return {"gaps": gaps, **{key: [r[key] for r in records if key in r] for key in OWN_LOOP_WORK}}


def summarize(runs: list[dict], episodes_per_step: int) -> dict:
    gaps = [g for run in runs for g in run["gaps"]]
    mean = statistics.fmean(gaps)
    pooled = {key: [v for run in runs for v in run[key]] for key in runs[0] if key != "gaps"}
    calls = pooled.pop("tool_calls") if "tool_calls" in pooled else pooled.pop("tools/call_frequency")
    agent_cpu = pooled.pop("agent_cpu_s_per_step", None)
    out: dict[str, Any] = {
        "step_s": statistics.median(gaps),
        "step_s_mean": mean,
        # Throughput over the timed steps: a burst of step ends can shorten a median gap, not the mean.
        "episodes_per_s": episodes_per_step / mean,
        "step_s_per_round": [statistics.median(run["gaps"]) for run in runs],
        "steps_timed": len(gaps),
        "gaps_s": [[round(g, 3) for g in run["gaps"]] for run in runs],
        "tool_calls_per_episode": statistics.fmean(calls),
        "completion_tokens_per_episode": statistics.fmean(pooled.pop("completions/mean_length")),
        "reward_mean": statistics.fmean(pooled.pop("reward")),
    }
    if agent_cpu is not None:
        # CPU of the agent's own process (SDK, HTTP, its gRPC server) per step, each run's steps all counted.
        out["agent_cpu_s_per_step"] = statistics.fmean(agent_cpu)
    # The agent run's counts, summed over its steps and rounds.
    out.update({key: sum(values) for key, values in pooled.items()})
    return out


def training_report(runs: dict[str, list[dict]], episodes_per_step: int) -> dict:
    """Each mode's summary and, per agent, its ratios to the own loop: median step, mean step, episodes/s,
    per round (agent ÷ own-loop median step, robust to a change in machine speed between rounds), and
    ``agent_cpu_floor`` = (own-loop step + the agent process's CPU per step) ÷ own-loop step, the ratio an
    agent path that cost nothing but the agent's own process would reach, were that CPU all on the step's
    critical path."""
    report: dict[str, Any] = {mode: summarize(runs[mode], episodes_per_step) for mode in MODES}
    own = report["own_loop"]
    for mode in AGENT_MODES:
        agent = report[mode]
        report[f"{mode}_ratios"] = {
            "step": agent["step_s"] / own["step_s"],
            "step_mean": agent["step_s_mean"] / own["step_s_mean"],
            "episodes_per_s": agent["episodes_per_s"] / own["episodes_per_s"],
            "agent_cpu_floor": (own["step_s"] + agent["agent_cpu_s_per_step"]) / own["step_s"],
            "paired": [
                statistics.median(a["gaps"]) / statistics.median(b["gaps"])
                for a, b in zip(runs[mode], runs["own_loop"], strict=True)
            ],
        }
    return report


# ------------------------------------------------------------------------------------- part 2: latency
def percentile(values: list[float], share: float) -> float:
    """Nearest-rank percentile (``share`` in [0, 1]) of ``values``."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * share))]


def latency_summary(rounds: list[list[tuple[float, int]]]) -> dict:
    """p50/p99 of the calls of all ``rounds`` (each a list of (seconds, completion tokens)), and each
    round's p50 (a round slowed by other work on the machine shows there)."""
    calls = [call for wave in rounds for call in wave]
    seconds = [s for s, _ in calls]
    return {
        "p50_s": percentile(seconds, 0.5),
        "p99_s": percentile(seconds, 0.99),
        "mean_s": statistics.fmean(seconds),
        "p50_s_per_round": [percentile([s for s, _ in wave], 0.5) for wave in rounds],
        "calls": len(calls),
        "completion_tokens_per_call": statistics.fmean(t for _, t in calls),
    }


async def timed_wave(calls: list[Callable[[], Any]]) -> list[tuple[float, int]]:
    """Start every call at once; (seconds, completion tokens) of each."""

    async def timed(call: Callable[[], Any]) -> tuple[float, int]:
        start = time.perf_counter()
        tokens = await call()
        return time.perf_counter() - start, tokens

    return list(await asyncio.gather(*(timed(call) for call in calls)))


async def bench_latency(model: Path, rollout: str, gateway_url: str, task: dict, args: argparse.Namespace):
    """The calls of ``args.latency_rounds`` rounds per side ("gateway", "in_process"), as a list of rounds
    of (seconds, completion tokens) per call."""
    messages = question_messages(task)
    core = await build_core(RolloutSettings(model=str(model), engine="hf"))
    client = RolloutClient(rollout, timeout_s=60)
    tickets = [await asyncio.to_thread(client.open_agent_session) for _ in range(args.sessions)]
    shared = shared_client()
    agents = [shared.with_options(base_url=f"{gateway_url}/sessions/{t.session_id}/v1") for t in tickets]
    try:
        prompt_ids = chat_token_ids(
            core.tokenizer, messages, add_generation_prompt=True, tools=[CALCULATOR_TOOL]
        )
        spec = SamplingSpec(temperature=1.0, max_tokens=args.latency_max_tokens)
        request = GenerateRequest((PromptInput(token_ids=tuple(prompt_ids)),), 1, spec)

        async def chat(agent: openai.AsyncOpenAI, **extra: Any):
            return await agent.chat.completions.create(
                model="policy",
                messages=messages,
                tools=[CALCULATOR_TOOL],
                temperature=1.0,
                max_tokens=args.latency_max_tokens,
                **extra,
            )

        async def gateway_call(agent: openai.AsyncOpenAI) -> int:
            return (await chat(agent)).usage.completion_tokens

        async def local_call() -> int:
            return len((await core.generate(request))[0].token_ids)

        reply = await chat(agents[0], extra_body={"return_token_ids": True})
        if list(reply.prompt_token_ids) != prompt_ids:
            raise RuntimeError("the gateway rendered other prompt ids than the in-process baseline")
        canned = (
            await agents[1].chat.completions.with_raw_response.create(
                model="policy",
                messages=messages,
                tools=[CALCULATOR_TOOL],
                max_tokens=args.max_tokens_per_call,
            )
        ).content
        waves = {
            "gateway": lambda: timed_wave([lambda a=a: gateway_call(a) for a in agents]),
            "in_process": lambda: timed_wave([local_call] * args.sessions),
        }
        rounds: dict[str, list[list[tuple[float, int]]]] = {name: [] for name in waves}
        for round_ in range(args.latency_rounds + 1):  # round 0 warms both up
            for name in waves if round_ % 2 == 0 else reversed(waves):
                done = await waves[name]()
                if round_:
                    rounds[name].append(done)
        return rounds, canned
    finally:
        await shared.close()
        for ticket in tickets:
            await asyncio.to_thread(client.close_agent_session, ticket.session_id)
        client.close()
        await core.close()


# -------------------------------------------------------------------------- part 3: the agent's own SDK
def serve_canned_reply(port: int, reply: bytes) -> None:
    """Answers every chat-completions POST on 127.0.0.1:``port`` with ``reply`` (a spawned process's target):
    the far side of the SDK-cost measurement, in a process of its own so that its CPU is not counted."""

    async def answer(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=reply, content_type="application/json")

    async def serve() -> None:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", answer)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        await asyncio.Event().wait()

    asyncio.run(serve())


def wait_listening(port: int, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


async def sdk_cpu_per_call(reply: bytes, messages: list[dict[str, Any]], args: argparse.Namespace) -> float:
    """CPU seconds of this process per ``chat.completions.create`` call made as the agent makes its calls (a
    copy at the base URL of the agent's ``shared_client``, the same request), ``--batch-size`` at once,
    against a server in another process answering ``reply``, a reply the gateway gave."""
    port = free_port()
    process = get_context("spawn").Process(target=serve_canned_reply, args=(port, reply), daemon=True)
    process.start()
    shared = shared_client()
    try:
        await asyncio.to_thread(wait_listening, port)

        async def call() -> None:
            client = shared.with_options(base_url=f"http://127.0.0.1:{port}/v1")
            await client.chat.completions.create(
                model="policy",
                messages=messages,
                tools=[CALCULATOR_TOOL],
                temperature=1.0,
                max_tokens=args.max_tokens_per_call,
            )

        for _ in range(3):  # warm-up: connections, the SDK's lazy imports
            await asyncio.gather(*(call() for _ in range(args.batch_size)))
        started = time.process_time()
        for _ in range(args.sdk_rounds):
            await asyncio.gather(*(call() for _ in range(args.batch_size)))
        return (time.process_time() - started) / (args.sdk_rounds * args.batch_size)
    finally:
        await shared.close()
        process.terminate()
        process.join(10)


def sdk_floor(cpu_per_call: float, tool_calls: list[int], episodes_per_step: int, own_step_s: float) -> dict:
    """What the agent's SDK alone adds to a step: its calls per step (an episode makes a second call when
    its first reply called the calculator; ``max_turns`` 2) × CPU per call, and the agent ÷ own-loop ratio
    an agent path that cost nothing else would reach, were that CPU all on the step's critical path."""
    calls_per_episode = 1 + statistics.fmean(calls > 0 for calls in tool_calls)
    per_step = cpu_per_call * calls_per_episode * episodes_per_step
    return {
        "cpu_s_per_call": cpu_per_call,
        "calls_per_episode": calls_per_episode,
        "cpu_s_per_step": per_step,
        "floor_ratio": (own_step_s + per_step) / own_step_s,
    }


# ------------------------------------------------------------------------------------------------ main
def write_report(out: Path, report: dict) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")


def warm_start_policy(root: Path, args: argparse.Namespace) -> tuple[Path, Path, dict]:
    """A ``--shape`` policy of the tools task warm-started under ``root`` (on every core): its directory,
    its training rows and the ``warm_start`` record of the results file."""
    model, data = root / "model", root / "data"
    warm = warm_start_tools_policy(model, data, args)
    record = {"shape": args.shape, "steps": args.warm_steps, "batch_size": args.warm_batch, **warm}
    return model, data / "train.jsonl", record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=ROOT / "models/tools")
    parser.add_argument("--data", type=Path, default=ROOT / "data/tools/train.jsonl")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=16, help="episodes per step")
    parser.add_argument("--num-generations", type=int, default=4)
    parser.add_argument("--max-completion-length", type=int, default=48)
    parser.add_argument("--max-tokens-per-call", type=int, default=16, help="the agent's max_tokens")
    parser.add_argument("--sessions", type=int, default=32, help="concurrent gateway sessions (latency)")
    parser.add_argument("--latency-rounds", type=int, default=8)
    parser.add_argument("--latency-max-tokens", type=int, default=16)
    parser.add_argument("--sdk-rounds", type=int, default=20, help="batches of SDK calls timed (part 3)")
    parser.add_argument("--shape", choices=("large",), help="warm-start a policy of this shape instead")
    parser.add_argument("--warm-steps", type=int, default=100, help="warm-start steps (--shape)")
    parser.add_argument("--warm-batch", type=int, default=8, help="warm-start batch size (--shape)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results/agents.json")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    load_at_start = os.getloadavg()[0]
    started = time.perf_counter()
    sampling = Sampling(temperature=1.0, max_tokens=args.max_tokens_per_call, max_turns=2)
    runs: dict[str, list[dict]] = {mode: [] for mode in MODES}
    with tempfile.TemporaryDirectory() as scratch, ExitStack() as stack:
        root = Path(scratch)
        warm_start = None
        if args.shape is not None:
            args.model, args.data, warm_start = warm_start_policy(root, args)
        task = json.loads(args.data.read_text().splitlines()[0])
        services, gateway_url = start_services(args.model, root / "logs", stack)
        episodes_log = root / "agent-episodes.jsonl"
        agents = {"agent": start_agent(sampling, episodes_log, stack)}
        agents["agent_node"] = start_node_agent(sampling, stack)
        latency, canned = asyncio.run(
            bench_latency(args.model, services.rollout_target, gateway_url, task, args)
        )
        sdk_cpu = asyncio.run(sdk_cpu_per_call(canned, question_messages(task), args))
        for round_ in range(args.rounds):
            for mode in MODES if round_ % 2 == 0 else reversed(MODES):
                print(f"== round {round_}: {mode}", flush=True)
                output = root / f"round{round_}" / mode
                target, pid = agents.get(mode, ("", 0))
                config = run_config(mode, output, args, services, target)
                torch.manual_seed(0)
                if mode in AGENT_MODES:
                    run = bench_agent(config, pid, episodes_log if mode == "agent" else None)
                else:
                    run = bench_own_loop(config)
                runs[mode].append(run)
    training = training_report(runs, args.batch_size)
    own = training["own_loop"]
    agent_tool_calls = [calls for run in runs["agent"] for calls in run["tool_calls"]]
    gateway, in_process = latency_summary(latency["gateway"]), latency_summary(latency["in_process"])
    report = {
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "torch": torch.__version__},
        "setup": {
            "commit": source_commit(),
            "model": str(args.model.relative_to(ROOT) if args.model.is_relative_to(ROOT) else args.model),
            "data": str(args.data.relative_to(ROOT) if args.data.is_relative_to(ROOT) else args.data),
            "warm_start": warm_start,
            "steps": args.steps,
            "rounds": args.rounds,
            "episodes_per_step": args.batch_size,
            "num_generations": args.num_generations,
            "max_completion_length": args.max_completion_length,
            "agent": {"sdk": "openai", "max_tokens_per_call": sampling.max_tokens, "max_turns": 2},
            "agent_node": {
                "sdk": "openai (npm), examples/node/agent_server.ts",
                "max_tokens_per_call": sampling.max_tokens,
                "max_turns": 2,
            },
            "own_loop": {"environment": "calculator", "max_tool_calling_iterations": 1},
            "lora_r": 16,
            "rollout_engine": "hf",
            "latency": {
                "sessions": args.sessions,
                "rounds": args.latency_rounds,
                "max_tokens": args.latency_max_tokens,
                "temperature": 1.0,
            },
        },
        "training": training,
        "agent_sdk": sdk_floor(sdk_cpu, agent_tool_calls, args.batch_size, own["step_s"]),
        "chat_latency": {
            "gateway": gateway,
            "in_process": in_process,
            "ratio_p50": gateway["p50_s"] / in_process["p50_s"],
            "ratio_p99": gateway["p99_s"] / in_process["p99_s"],
        },
        "targets": TARGETS,
        "wall_seconds": time.perf_counter() - started,
        "load_average_1m_at_start": load_at_start,
        "load_average_1m_at_end": os.getloadavg()[0],
    }
    write_report(args.out, report)
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
