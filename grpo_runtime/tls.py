"""TLS and mutual-TLS credentials from PEM files, for servers and channels."""

from __future__ import annotations

from pathlib import Path

import grpc

from grpo_runtime.config import ConfigError


def _read(path: Path, key: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"{key}: cannot read {path}: {exc.strerror or exc}") from exc


def server_credentials(
    cert_file: Path, key_file: Path, client_ca_file: Path | None = None
) -> grpc.ServerCredentials:
    """Server TLS from a certificate chain and key; with ``client_ca_file`` clients must present a
    certificate signed by that CA (mutual TLS), otherwise the handshake fails."""
    return grpc.ssl_server_credentials(
        [(_read(key_file, "tls_key_file"), _read(cert_file, "tls_cert_file"))],
        root_certificates=_read(client_ca_file, "tls_client_ca_file") if client_ca_file else None,
        require_client_auth=client_ca_file is not None,
    )


def channel_credentials(
    ca_file: Path | None = None, cert_file: Path | None = None, key_file: Path | None = None
) -> grpc.ChannelCredentials:
    """Client TLS: trust ``ca_file`` (None = the system roots) and, for mutual TLS, present
    ``cert_file``/``key_file`` (both or neither)."""
    if (cert_file is None) != (key_file is None):
        raise ConfigError("tls_cert_file and tls_key_file must be set together")
    return grpc.ssl_channel_credentials(
        root_certificates=_read(ca_file, "tls_ca_file") if ca_file else None,
        private_key=_read(key_file, "tls_key_file") if key_file else None,
        certificate_chain=_read(cert_file, "tls_cert_file") if cert_file else None,
    )
