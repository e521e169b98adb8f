"""JSON log lines: fixed keys, RPC context from the context variable, extras, exceptions."""

from __future__ import annotations

import io
import json
import logging
import sys

from grpo_runtime.logging_setup import (
    JsonFormatter,
    RpcContext,
    configure_logging,
    current_request_id,
    current_rpc,
)


def _record(message: str, exc_info=None, extra=None) -> logging.LogRecord:
    logger = logging.getLogger("grpo.test")
    return logger.makeRecord(logger.name, logging.INFO, __file__, 1, message, (), exc_info, extra=extra)


def test_a_record_is_one_json_object_with_the_fixed_keys():
    line = JsonFormatter().format(_record("hello"))
    entry = json.loads(line)
    assert "\n" not in line
    assert entry["message"] == "hello" and entry["level"] == "INFO" and entry["logger"] == "grpo.test"
    assert entry["time"].endswith("+00:00")
    assert "request_id" not in entry


def test_rpc_context_and_extras_are_included():
    token = current_rpc.set(RpcContext("grpo.x.v1.X", "Do", "rid-1"))
    try:
        assert current_request_id() == "rid-1"
        entry = json.loads(JsonFormatter().format(_record("m", extra={"code": "OK", "duration_ms": 1.5})))
    finally:
        current_rpc.reset(token)
    assert (entry["service"], entry["method"], entry["request_id"]) == ("grpo.x.v1.X", "Do", "rid-1")
    assert (entry["code"], entry["duration_ms"]) == ("OK", 1.5)
    assert current_request_id() is None


def test_exceptions_keep_their_traceback_in_one_line():
    try:
        raise ValueError("bad thing")
    except ValueError:
        record = _record("failed", exc_info=sys.exc_info())
    line = JsonFormatter().format(record)
    assert "\n" not in line
    assert "ValueError: bad thing" in json.loads(line)["exception"]


def test_configure_logging_replaces_root_handlers():
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        stream = io.StringIO()
        configure_logging("WARNING", stream)
        configure_logging("INFO", stream)
        logging.getLogger("grpo.test").info("once")
        assert [json.loads(line)["message"] for line in stream.getvalue().splitlines()] == ["once"]
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
