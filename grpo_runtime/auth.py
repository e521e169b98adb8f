"""Bearer-token protection of admin RPCs.

An RPC is *admin* when its method descriptor carries the proto option ``(grpo.common.v1.admin) =
true``. When the server has an admin token, such calls must send the metadata
``authorization: Bearer <token>``; the comparison is constant-time so response timing does not
leak how much of a guessed token matched.

The server interceptor also records, per call, whether the caller holds the admin token
(:func:`caller_is_admin`), so a public RPC can leave out what only admins may see.
"""

from __future__ import annotations

import contextvars
import hmac
from collections.abc import Iterable, Sequence

from google.protobuf.descriptor import ServiceDescriptor
from grpo.common.v1 import common_pb2

AUTHORIZATION_KEY = "authorization"
BEARER_SCHEME = "bearer"

# Whether the caller of the RPC being served holds the admin token (every caller does on a server that has
# none); set by the server interceptor for each call, False outside an RPC.
_caller_is_admin: contextvars.ContextVar[bool] = contextvars.ContextVar("grpo_caller_is_admin", default=False)


def admin_methods(services: Iterable[ServiceDescriptor]) -> frozenset[str]:
    """Full gRPC method paths (``/pkg.Service/Method``) of every RPC marked admin in ``services``."""
    return frozenset(
        f"/{service.full_name}/{method.name}"
        for service in services
        for method in service.methods
        # protoc's .pyi declares extensions as plain FieldDescriptor, not the typed extension descriptor.
        if method.GetOptions().Extensions[common_pb2.admin]  # type: ignore[index]
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


def caller_is_admin() -> bool:
    """Whether the caller of the RPC being served may call admin RPCs (False outside an RPC)."""
    return _caller_is_admin.get()


def set_caller_is_admin(admin: bool) -> None:
    """Record for the RPC being served whether its caller holds the admin token (the interceptor's job)."""
    _caller_is_admin.set(admin)
