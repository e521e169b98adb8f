"""An aiohttp application served beside a gRPC server (:class:`grpo_runtime.server.Companion`): on the
server's host, with its TLS (and mutual-TLS) files, started and stopped with it, its requests counted by
:class:`~grpo_runtime.http_metrics.HttpMetrics` (export :attr:`HttpCompanion.metrics` as the binding's
collector). The reward service's OpenRLHF endpoint and the rollout service's OpenAI-compatible gateway are
two of these.
"""

from __future__ import annotations

import logging
import ssl

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from grpo_runtime.config import ServerConfig
from grpo_runtime.http_metrics import HttpMetrics
from grpo_runtime.server import BindError

log = logging.getLogger(__name__)


class _UnparsableRequestFilter(logging.Filter):
    """aiohttp logs a request it could not parse (a request line or header over its limit, a malformed
    header) at ERROR with its traceback, but a bad method at DEBUG "to not fill logs with noise". Each is the
    caller's fault and answered 400, so any caller could fill the logs with them: these records go to DEBUG
    too, without the traceback; every other record of aiohttp's server logger is left as it is."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if not isinstance(error, HttpProcessingError):
            return True
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        record.msg, record.args = f"{record.getMessage()}: {error.code} {error.message}"[:300], None
        record.exc_info = record.exc_text = None
        return _SERVER_LOG.isEnabledFor(logging.DEBUG)


# The logger the endpoints' request handlers log to: aiohttp's own, filtered.
_SERVER_LOG = logging.getLogger(f"{__name__}.server")
_SERVER_LOG.addFilter(_UnparsableRequestFilter())


def ssl_context(config: ServerConfig) -> ssl.SSLContext | None:
    """The gRPC server's TLS (and mutual TLS) settings for HTTPS; None when TLS is off."""
    if not config.tls_enabled:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(str(config.tls_cert_file), str(config.tls_key_file))
    if config.tls_client_ca_file is not None:
        context.load_verify_locations(str(config.tls_client_ca_file))
        context.verify_mode = ssl.CERT_REQUIRED
    return context


class HttpCompanion:
    """Serves ``app`` on ``port`` (0: any free one; :attr:`port` is the bound one after ``start``).

    ``header_timeout_s``: how long a connection may take to send a request's headers (aiohttp's keep-alive
    timer also runs from a connection's opening and is only reset by a complete request, so a client that
    trickles its headers is closed when it fires). ``what`` names the endpoint in the start-up log line.
    """

    def __init__(
        self, app: web.Application, port: int, *, header_timeout_s: float, metrics: HttpMetrics, what: str
    ):
        self.app = app
        self.metrics = metrics
        self._requested_port = port
        self._header_timeout_s = header_timeout_s
        self._what = what
        self._runner: web.AppRunner | None = None
        self.port: int | None = None

    async def start(self, config: ServerConfig) -> None:
        runner = web.AppRunner(
            self.app,
            access_log=None,
            shutdown_timeout=config.grace_period_s,
            keepalive_timeout=self._header_timeout_s,
            logger=_SERVER_LOG,
        )
        await runner.setup()
        site = web.TCPSite(runner, config.host, self._requested_port, ssl_context=ssl_context(config))
        try:
            await site.start()
        except OSError as exc:
            await runner.cleanup()
            raise BindError(f"cannot bind HTTP {config.host}:{self._requested_port}: {exc.strerror}") from exc
        self._runner = runner
        self.port = runner.addresses[0][1]
        log.info("HTTP endpoint (%s) on %s:%d", self._what, config.host, self.port)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
