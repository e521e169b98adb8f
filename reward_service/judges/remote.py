"""Remote judges (``judge:<name>`` of the ``judges:`` settings): an OpenAI-compatible chat-completions
endpoint asked about each completion.

Pointwise, each sample is one request whose answer is read as a verdict (``yes_no``: the first word is
the positive word → 1.0, the negative one → 0.0) or a score (its first number in 0..max_score, divided
by max_score). ``mode: group`` (RULER-style, OpenPipe ART) sends one request per group listing every
completion and reads one ``[k]: score`` line per completion, divided by max_score; the judge ranks the
completions against each other. An answer that cannot be read is that sample's component error quoting
its start; so are a timeout, a refused request and an exhausted retry budget (see
``RemoteJudgeSettings``). The bearer token travels only in the Authorization header: it is never logged
nor put in an error. A refusal or an unreadable reply is reported by its status and a fixed reason, never
its body: a judge that echoes the request's headers in an error page would otherwise hand the token to
every Score caller.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import Sequence
from http import HTTPStatus
from typing import Any

import aiohttp

from reward_service.core.types import ComponentResult, ParamInfo, RewardDescription, Sample
from reward_service.judges.settings import RemoteJudgeSettings
from reward_service.judges.template import JudgeTemplate, TemplateError, cut_middle, numbered, prompt_text
from reward_service.rewards.accuracy import group_indices

log = logging.getLogger(__name__)

RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_GROUP_LINE = re.compile(r"\[\s*(\d+)\s*\]\s*[:=\-]?\s*(-?\d+(?:\.\d+)?)")
_WORD = re.compile(r"[^\W_]+")
# Characters of a judge's answer quoted in an error.
QUOTE_CHARS = 80


class JudgeError(Exception):
    """One request's failure, as its samples' component error says it."""


def _quote(text: str) -> str:
    return repr(text[:QUOTE_CHARS] + ("..." if len(text) > QUOTE_CHARS else ""))


class RemoteJudge:
    """A remote judge as a built-in reward (``description`` + ``score``); ``close`` ends its HTTP session."""

    def __init__(self, name: str, settings: RemoteJudgeSettings, api_key: str | None) -> None:
        self.name = f"judge:{name}"
        self._settings = settings
        self._pointwise = JudgeTemplate.parse(settings.template, kind="pointwise")
        self._group = JudgeTemplate.parse(settings.group_template, kind="group_scores")
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._limit = asyncio.Semaphore(settings.max_concurrency)
        self._session: aiohttp.ClientSession | None = None
        self.requests_sent = 0  # HTTP attempts, retries included (tests, metrics)
        read = "Yes/No → 1/0" if settings.verdict == "yes_no" else "a score / max_score"
        self.description = RewardDescription(
            name=self.name,
            description=f"Remote judge {settings.model!r} (OpenAI-compatible chat completions): "
            f"pointwise, the answer read as {read}; mode=group, one request per group with a "
            f"'[k]: score' line per completion (RULER-style), score / {settings.max_score:g}. "
            f"Completions over {settings.max_completion_chars} characters are cut in the middle "
            f"with a marker; {settings.timeout_s:g}s per sample, retries included.",
            params=(
                ParamInfo(
                    name="mode",
                    type="string",
                    default="pointwise",
                    description="pointwise: one request per completion; group: one per group, "
                    "its completions scored together.",
                    choices=("pointwise", "group"),
                ),
            ),
            required_metadata=self._pointwise.metadata_fields,
            min_value=0.0,
            max_value=1.0,
            group_aware=True,
        )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def score(self, samples: Sequence[Sample], params: dict[str, Any]) -> list[ComponentResult]:
        if params.get("mode") == "group":
            results: list[ComponentResult] = [ComponentResult()] * len(samples)
            groups = group_indices(samples)
            scored = await asyncio.gather(*(self._score_group([samples[i] for i in m]) for m in groups))
            for members, group_results in zip(groups, scored, strict=True):
                for index, result in zip(members, group_results, strict=True):
                    results[index] = result
            return results
        return list(await asyncio.gather(*(self._score_one(s) for s in samples)))

    def _cut(self, text: str) -> str:
        cut = cut_middle(text, self._settings.max_completion_chars, "characters")
        return text if cut is None else cut[0] + cut[2] + cut[1]

    async def _score_one(self, sample: Sample) -> ComponentResult:
        try:
            values = {"prompt": prompt_text(sample), **self._pointwise.metadata(sample)}
        except TemplateError as exc:
            return ComponentResult(error=str(exc))
        text = self._pointwise.fill({**values, "completion": self._cut(sample.completion)})
        try:
            answer = await self._ask(text, self._settings.max_tokens)
            return ComponentResult(value=self._read_verdict(answer))
        except JudgeError as exc:
            return ComponentResult(error=f"{self.name}: {exc}")

    async def _score_group(self, samples: list[Sample]) -> list[ComponentResult]:
        try:
            values = {"prompt": prompt_text(samples[0]), **self._group.metadata(samples[0])}
        except TemplateError as exc:
            return [ComponentResult(error=str(exc))] * len(samples)
        listing = numbered([self._cut(s.completion) for s in samples])
        try:
            answer = await self._ask(
                self._group.fill({**values, "completions": listing}), self._settings.group_max_tokens
            )
        except JudgeError as exc:
            return [ComponentResult(error=f"{self.name}: {exc}")] * len(samples)
        scores: dict[int, str] = {}
        for match in _GROUP_LINE.finditer(answer):
            scores.setdefault(int(match.group(1)), match.group(2))
        results = []
        for k in range(1, len(samples) + 1):
            if k not in scores:
                results.append(ComponentResult(error=f"{self.name}: no score for [{k}] in {_quote(answer)}"))
                continue
            try:
                results.append(ComponentResult(value=self._scaled(scores[k], answer)))
            except JudgeError as exc:
                results.append(ComponentResult(error=f"{self.name}: [{k}]: {exc}"))
        return results

    def _read_verdict(self, answer: str) -> float:
        settings = self._settings
        if settings.verdict == "score":
            match = _NUMBER.search(answer)
            if match is None:
                raise JudgeError(f"no score in the answer {_quote(answer)}")
            return self._scaled(match.group(), answer)
        word = _WORD.search(answer)
        first = word.group().casefold() if word else ""
        if first == settings.positive.casefold():
            return 1.0
        if first == settings.negative.casefold():
            return 0.0
        raise JudgeError(
            f"the answer {_quote(answer)} is neither {settings.positive!r} nor {settings.negative!r}"
        )

    def _scaled(self, number: str, answer: str) -> float:
        value, top = float(number), self._settings.max_score
        if not 0 <= value <= top:
            raise JudgeError(f"score {number} is outside 0..{top:g} in {_quote(answer)}")
        return value / top

    async def _ask(self, text: str, max_tokens: int) -> str:
        """The judge's answer to the user turn ``text``: the first choice's message content. JudgeError on a
        refusal, an unreadable reply, retries exhausted or ``timeout_s`` passed (retries included)."""
        settings = self._settings
        body = {
            "model": settings.model,
            "messages": [{"role": "user", "content": text}],
            "temperature": 0,
            "max_tokens": max_tokens,
        }
        async with self._limit:
            try:
                async with asyncio.timeout(settings.timeout_s):
                    return await self._post_with_retries(body)
            except TimeoutError:
                raise JudgeError(f"no answer within {settings.timeout_s:g}s (timeout_s)") from None

    async def _post_with_retries(self, body: dict[str, Any]) -> str:
        settings = self._settings
        if self._session is None:
            self._session = aiohttp.ClientSession(headers=self._headers)
        url = f"{settings.base_url}/chat/completions"
        attempt = 0
        while True:
            self.requests_sent += 1
            try:
                async with self._session.post(url, json=body) as response:
                    if response.status == 200:
                        try:
                            return _content(await response.json(content_type=None))
                        except ValueError:
                            raise JudgeError("unreadable reply: not JSON") from None
                    reason = _status_text(response.status)
                    retry_after = response.headers.get("Retry-After")
                    if response.status not in RETRY_STATUSES:
                        raise JudgeError(f"refused: {reason}")
            except aiohttp.ClientError as exc:  # connection refused or reset, a reply cut short
                reason, retry_after = type(exc).__name__, None
            if attempt >= settings.retries:
                raise JudgeError(f"gave up after {attempt + 1} attempts, last: {reason}")
            delay = min(settings.max_backoff_s, settings.backoff_s * 2**attempt)
            if retry_after is not None:
                with contextlib.suppress(ValueError):
                    delay = min(settings.max_backoff_s, max(delay, float(retry_after)))
            log.info("%s: %s, retrying in %.2fs", self.name, reason, delay)
            await asyncio.sleep(delay)
            attempt += 1


def _status_text(status: int) -> str:
    """``HTTP 401 Unauthorized``: the code and the standard phrase for it, not the server's own text."""
    try:
        return f"HTTP {status} {HTTPStatus(status).phrase}"
    except ValueError:
        return f"HTTP {status}"


def _content(reply: Any) -> str:
    """``choices[0].message.content`` of a chat-completions reply; JudgeError when it has none."""
    try:
        content = reply["choices"][0]["message"]["content"]
    except (KeyError, IndexError, TypeError):
        raise JudgeError("unreadable reply: no choices[0].message.content") from None
    if not isinstance(content, str):
        raise JudgeError("unreadable reply: the content is not text")
    return content


def remote_judges(configured: dict[str, RemoteJudgeSettings]) -> dict[str, RemoteJudge]:
    """Reward name → remote judge for every configured judge (tokens read now; ConfigError names the key)."""
    return {
        f"judge:{name}": RemoteJudge(name, settings, settings.api_key(name))
        for name, settings in configured.items()
    }
