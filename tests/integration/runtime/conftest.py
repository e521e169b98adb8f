"""Fixtures for the runtime's integration tests: the test service, servers on port 0, certificates."""

from __future__ import annotations

import datetime
import importlib.util
import ipaddress
import sys
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from grpo_runtime.config import ServerConfig
from grpo_runtime.server import GrpcServer

HERE = Path(__file__).parent
TEST_SERVICE_SCRIPT = HERE / "runtime_test_service.py"


def _load_test_service() -> ModuleType:
    """Import the test service script by path (tests run with --import-mode=importlib)."""
    name = "runtime_test_service"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, TEST_SERVICE_SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


_test_service = _load_test_service()


@pytest.fixture(scope="session")
def test_service() -> ModuleType:
    """The test service module (see runtime_test_service.py): servicers, ``bindings()``, ``main()``."""
    return _test_service


@pytest.fixture
async def start_server() -> AsyncIterator[Callable[..., object]]:
    """``await start_server(**ServerConfig fields)`` → a started GrpcServer on 127.0.0.1:0 serving the
    test service; every server is stopped (grace 0) at the end of the test."""
    servers: list[GrpcServer] = []

    async def start(**fields) -> GrpcServer:
        config = ServerConfig(**{"host": "127.0.0.1", "port": 0, **fields})
        server = GrpcServer(config, _test_service.bindings())
        await server.start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        await server.stop(grace_s=0)


@dataclass(frozen=True)
class Certificates:
    """PEM files: a CA, a server certificate for 127.0.0.1/localhost, and a client certificate."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> Path:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return path


def _certificate(
    subject: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: x509.Name | None,
    issuer_key: ec.EllipticCurvePrivateKey,
    *,
    ca: bool,
    usage: ExtendedKeyUsageOID | None = None,
    san: list[x509.GeneralName] | None = None,
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer or name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if usage is not None:
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    if san:
        builder = builder.add_extension(x509.SubjectAlternativeName(san), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


@pytest.fixture(scope="session")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    """A throwaway CA with a server certificate (SAN IP 127.0.0.1, DNS localhost) and a client one."""
    out = tmp_path_factory.mktemp("tls")
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = _certificate("grpo test CA", ca_key, None, ca_key, ca=True)
    server_key = ec.generate_private_key(ec.SECP256R1())
    server_cert = _certificate(
        "localhost",
        server_key,
        ca_cert.subject,
        ca_key,
        ca=False,
        usage=ExtendedKeyUsageOID.SERVER_AUTH,
        san=[x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")],
    )
    client_key = ec.generate_private_key(ec.SECP256R1())
    client_cert = _certificate(
        "grpo test client",
        client_key,
        ca_cert.subject,
        ca_key,
        ca=False,
        usage=ExtendedKeyUsageOID.CLIENT_AUTH,
    )
    pem = serialization.Encoding.PEM
    (out / "ca.pem").write_bytes(ca_cert.public_bytes(pem))
    (out / "server.pem").write_bytes(server_cert.public_bytes(pem))
    (out / "client.pem").write_bytes(client_cert.public_bytes(pem))
    return Certificates(
        ca=out / "ca.pem",
        server_cert=out / "server.pem",
        server_key=_write_key(server_key, out / "server.key"),
        client_cert=out / "client.pem",
        client_key=_write_key(client_key, out / "client.key"),
    )
