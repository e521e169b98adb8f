"""Bearer-token protection of admin RPCs.

An RPC is *admin* when its method descriptor carries the proto option ``(grpo.common.v1.admin) =
true``. When the server has an admin token, such calls must send the metadata
``authorization: Bearer <token>``; the comparison is constant-time so response timing does not
leak how much of a guessed token matched.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable, Sequence

from google.protobuf.descriptor import ServiceDescriptor
from grpo.common.v1 import common_pb2

AUTHORIZATION_KEY = "authorization"
BEARER_SCHEME = "bearer"


def admin_methods(services: Iterable[ServiceDescriptor]) -> frozenset[str]:
    """Full gRPC method paths (``/pkg.Service/Method``) of every RPC marked admin in ``services``."""
    return frozenset(
        f"/{service.full_name}/{method.name}"
        for service in services
        for method in service.methods
        if method.GetOptions().Extensions[common_pb2.admin]
    )


def bearer_token(metadata: Sequence[tuple[str, str | bytes]] | None) -> str | None:
    """The token of the first ``authorization: Bearer <token>`` metadata entry, or None."""
    for key, value in metadata or ():
        if key.lower() != AUTHORIZATION_KEY:
            continue
        text = value.decode("utf-8", "replace") if isinstance(value, bytes) else value
        scheme, _, token = text.strip().partition(" ")
        if scheme.lower() == BEARER_SCHEME and token.strip():
            return token.strip()
    return None


def token_matches(presented: str | None, expected: str) -> bool:
    """Constant-time comparison of a presented token with the configured one."""
    if presented is None:
        return False
    return hmac.compare_digest(presented.encode(), expected.encode())


def bearer_metadata(token: str) -> tuple[str, str]:
    """The metadata pair a client sends to authenticate with ``token``."""
    return (AUTHORIZATION_KEY, f"Bearer {token}")
