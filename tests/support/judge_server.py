"""A small OpenAI-compatible chat-completions server on 127.0.0.1 for the remote-judge tests.

``POST /v1/chat/completions`` answers with the tiny judge model through transformers (greedy, the chat
template with the generation prompt, at most ``max_tokens`` new tokens), or with a fixed ``answer`` when
one is set. Faults are scripted: ``fail`` is a list of HTTP statuses returned to the next requests, one
each, before answering normally; ``delay_s`` holds every answer back. It records the requests it got
(bodies and Authorization headers) and the most it served at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from aiohttp import web
from transformers import AutoModelForCausalLM, AutoTokenizer


@dataclass
class JudgeServer:
    model_path: Path | None = None
    answer: str | None = None
    fail: list[int] = field(default_factory=list)
    delay_s: float = 0.0
    retry_after: str | None = None
    bodies: list[dict[str, Any]] = field(default_factory=list)
    authorizations: list[str | None] = field(default_factory=list)
    in_flight: int = 0
    most_in_flight: int = 0
    url: str = ""

    def __post_init__(self) -> None:
        self._lock = threading.Lock()  # one generate at a time (the tokenizer is not thread-safe)
        if self.model_path is not None:
            self._tokenizer = AutoTokenizer.from_pretrained(self.model_path)
            self._model = AutoModelForCausalLM.from_pretrained(self.model_path).eval()

    def generate(self, messages: list[dict[str, str]], max_tokens: int) -> str:
        with self._lock, torch.inference_mode():
            text = self._tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            ids = self._tokenizer(text, add_special_tokens=False, return_tensors="pt")
            out = self._model.generate(**ids, max_new_tokens=max_tokens, do_sample=False)
            return self._tokenizer.decode(out[0, ids["input_ids"].shape[1] :], skip_special_tokens=True)

    async def _chat(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.bodies.append(body)
        self.authorizations.append(request.headers.get("Authorization"))
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            if self.fail:
                status = self.fail.pop(0)
                headers = {"Retry-After": self.retry_after} if self.retry_after else {}
                return web.json_response({"error": {"message": "scripted"}}, status=status, headers=headers)
            await asyncio.sleep(self.delay_s)
            if self.answer is not None:
                content = self.answer
            else:
                content = await asyncio.to_thread(
                    self.generate, body["messages"], int(body.get("max_tokens", 16))
                )
            return web.json_response(
                {
                    "id": "chatcmpl-test",
                    "object": "chat.completion",
                    "model": body.get("model", ""),
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": content},
                            "finish_reason": "stop",
                        }
                    ],
                }
            )
        finally:
            self.in_flight -= 1


@contextlib.asynccontextmanager
async def serve_judge(server: JudgeServer) -> AsyncIterator[JudgeServer]:
    """Serves ``server`` on 127.0.0.1 (a free port) in the running loop; ``server.url``: its ``/v1`` root."""
    app = web.Application()
    app.router.add_post("/v1/chat/completions", server._chat)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    server.url = f"http://127.0.0.1:{port}/v1"
    try:
        yield server
    finally:
        await runner.cleanup()
