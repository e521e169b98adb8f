"""The status of a call that must fail, whether it went through a generated stub or a service client."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc
import pytest

from grpo_runtime.call_errors import ServiceCallError


def failure(call: Callable[[], Any]) -> tuple[grpc.StatusCode, str]:
    """(status code, details) of ``call()``, which must raise: a stub's ``grpc.RpcError`` or a client's
    :class:`ServiceCallError`."""
    with pytest.raises((grpc.RpcError, ServiceCallError)) as info:
        call()
    error = info.value
    if isinstance(error, ServiceCallError):
        return error.code, error.details
    return error.code(), error.details()
