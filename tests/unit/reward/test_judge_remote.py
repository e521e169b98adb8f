"""Remote judges against a real chat-completions server on 127.0.0.1 (tests/support/judge_server.py):
answers read as verdicts and scores, retries on 429/5xx with backoff, the per-sample deadline, the
concurrency limit, group scoring, and the bearer token kept out of every error (a refusal or an unreadable
reply is its status and a fixed reason, never its body)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from pydantic import ValidationError

from grpo_runtime.config import ConfigError
from reward_service.core.types import Message, Sample
from reward_service.judges.remote import RemoteJudge, remote_judges
from reward_service.judges.settings import RemoteJudgeSettings
from tests.support.judge_server import JudgeServer, serve_judge
from tiny_models.judge import POINTWISE_TEMPLATE

PROMPT = (Message("user", "What is 3 + 4?"),)
TOKEN = "sk-test-do-not-leak-9f2c"


def _samples(*completions: str, group: str = "") -> list[Sample]:
    return [
        Sample(id=str(i), prompt=PROMPT, completion=c, metadata={"answer": 7}, group=group)
        for i, c in enumerate(completions)
    ]


def _judge(server: JudgeServer, **settings) -> RemoteJudge:
    config = RemoteJudgeSettings(base_url=server.url, model="tiny-judge", backoff_s=0.01, **settings)
    return RemoteJudge("remote", config, TOKEN)


async def test_tiny_judge_served_over_http_discriminates(tiny_models):
    async with serve_judge(JudgeServer(model_path=tiny_models["judge"])) as server:
        judge = _judge(server, template=POINTWISE_TEMPLATE, max_tokens=1)
        try:
            results = await judge.score(
                _samples("The answer is \\boxed{7}.", "The answer is 7."), {"mode": "pointwise"}
            )
        finally:
            await judge.close()
    assert [r.value for r in results] == [1.0, 0.0], results
    assert server.bodies[0]["model"] == "tiny-judge" and server.bodies[0]["temperature"] == 0
    assert "Answer: 7\nResponse: The answer is" in server.bodies[0]["messages"][0]["content"]
    assert server.authorizations == [f"Bearer {TOKEN}"] * 2


async def test_retries_429_then_answers():
    async with serve_judge(JudgeServer(answer="Yes", fail=[429, 503], retry_after="0")) as server:
        judge = _judge(server, retries=2)
        try:
            (result,) = await judge.score(_samples("x"), {})
        finally:
            await judge.close()
    assert result.value == 1.0 and result.error == ""
    assert judge.requests_sent == 3


async def test_gives_up_after_the_retries_and_never_shows_the_token():
    async with serve_judge(JudgeServer(answer="Yes", fail=[500] * 5)) as server:
        judge = _judge(server, retries=1)
        try:
            (result,) = await judge.score(_samples("x"), {})
        finally:
            await judge.close()
    assert result.value is None and "gave up after 2 attempts, last: HTTP 500" in result.error
    assert TOKEN not in result.error


async def test_a_client_error_is_not_retried():
    async with serve_judge(JudgeServer(answer="Yes", fail=[400])) as server:
        judge = _judge(server, retries=3)
        try:
            (result,) = await judge.score(_samples("x"), {})
        finally:
            await judge.close()
    assert "refused: HTTP 400" in result.error and judge.requests_sent == 1


async def test_deadline_per_sample_is_a_component_error():
    async with serve_judge(JudgeServer(answer="Yes", delay_s=5)) as server:
        judge = _judge(server, timeout_s=0.2)
        try:
            started = asyncio.get_running_loop().time()
            results = await judge.score(_samples("a", "b"), {})
            elapsed = asyncio.get_running_loop().time() - started
        finally:
            await judge.close()
    assert all(r.value is None and "no answer within 0.2s (timeout_s)" in r.error for r in results)
    assert elapsed < 4  # did not wait for the server


async def test_concurrency_limit_holds():
    async with serve_judge(JudgeServer(answer="No", delay_s=0.05)) as server:
        judge = _judge(server, max_concurrency=2)
        try:
            results = await judge.score(_samples(*"abcdef"), {})
        finally:
            await judge.close()
    assert [r.value for r in results] == [0.0] * 6
    assert server.most_in_flight == 2


@pytest.mark.parametrize(
    ("answer", "verdict", "value", "error"),
    [
        ("yes, it is right", "yes_no", 1.0, ""),
        ("Maybe", "yes_no", None, "neither 'Yes' nor 'No'"),
        ("Score: 7", "score", 0.7, ""),
        ("15", "score", None, "outside 0..10"),
        ("no number", "score", None, "no score"),
    ],
)
async def test_answers_are_read_or_reported(answer, verdict, value, error):
    async with serve_judge(JudgeServer(answer=answer)) as server:
        judge = _judge(server, verdict=verdict)
        try:
            (result,) = await judge.score(_samples("x"), {})
        finally:
            await judge.close()
    assert result.value == (pytest.approx(value) if value is not None else None)
    assert error in result.error


async def test_group_mode_is_one_request_per_group():
    async with serve_judge(JudgeServer(answer="[1]: 10\n[2]: 3\n")) as server:
        judge = _judge(server)
        try:
            samples = _samples("a", "b", group="p") + _samples("c", "d", "e", group="q")
            results = await judge.score(samples, {"mode": "group"})
        finally:
            await judge.close()
    assert [r.value for r in results[:4]] == [1.0, pytest.approx(0.3), 1.0, pytest.approx(0.3)]
    assert results[4].value is None and "no score for [3]" in results[4].error
    assert len(server.bodies) == 2
    assert "[1] c\n\n[2] d\n\n[3] e" in server.bodies[1]["messages"][0]["content"]


async def test_missing_metadata_and_huge_completions():
    async with serve_judge(JudgeServer(answer="Yes")) as server:
        judge = _judge(server, max_completion_chars=100)
        try:
            bare = Sample(id="x", prompt=PROMPT, completion="7")
            results = await judge.score([bare, *_samples("y" * 10_000)], {})
        finally:
            await judge.close()
    assert results[0].value is None and "metadata 'answer' is required" in results[0].error
    assert results[1].value == 1.0
    sent = server.bodies[0]["messages"][0]["content"]
    assert "9900 of 10000 characters of this response cut" in sent and len(sent) < 1000


async def test_unreachable_endpoint_is_an_error_after_retries():
    judge = RemoteJudge(
        "down", RemoteJudgeSettings(base_url="http://127.0.0.1:9", model="m", retries=1, backoff_s=0.01), None
    )
    try:
        (result,) = await judge.score(_samples("x"), {})
    finally:
        await judge.close()
    assert "gave up after 2 attempts" in result.error


def test_settings_refuse_bad_urls_templates_and_missing_tokens(monkeypatch):
    with pytest.raises(ValidationError, match="not an http"):
        RemoteJudgeSettings(base_url="file:///etc/passwd", model="m")
    with pytest.raises(ValidationError, match=r"needs \{completion\}"):
        RemoteJudgeSettings(base_url="http://127.0.0.1:1", model="m", template="{answer}")
    monkeypatch.delenv("JUDGE_TOKEN_FOR_TEST", raising=False)
    config = RemoteJudgeSettings(base_url="http://127.0.0.1:1", model="m", api_key_env="JUDGE_TOKEN_FOR_TEST")
    with pytest.raises(ConfigError, match=r"judges\.j\.api_key_env"):
        remote_judges({"j": config})
    monkeypatch.setenv("JUDGE_TOKEN_FOR_TEST", TOKEN)
    assert set(remote_judges({"j": config})) == {"judge:j"}


@contextlib.asynccontextmanager
async def echoing_judge(status: int) -> AsyncIterator[str]:
    """A judge that answers every request with ``status`` and a body quoting its Authorization header (a
    debug error page, or a 200 without choices); yields its ``/v1`` URL."""

    async def echo(request: web.Request) -> web.Response:
        return web.json_response(
            {"error": f"bad header: {request.headers.get('Authorization')}"}, status=status
        )

    app = web.Application()
    app.router.add_post("/v1/chat/completions", echo)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}/v1"
    finally:
        await runner.cleanup()


@pytest.mark.parametrize(
    ("status", "error"),
    [
        (401, "refused: HTTP 401 Unauthorized"),
        (200, "unreadable reply: no choices[0].message.content"),
        (503, "gave up after 2 attempts, last: HTTP 503 Service Unavailable"),
    ],
)
async def test_a_judge_that_echoes_the_token_in_its_body_never_has_it_quoted(status, error):
    async with echoing_judge(status) as url:
        config = RemoteJudgeSettings(base_url=url, model="m", retries=1, backoff_s=0.01)
        judge = RemoteJudge("echo", config, TOKEN)
        try:
            (result,) = await judge.score(_samples("x"), {})
        finally:
            await judge.close()
    assert result.value is None and result.error == f"judge:echo: {error}"
    assert TOKEN not in result.error and "bad header" not in result.error
