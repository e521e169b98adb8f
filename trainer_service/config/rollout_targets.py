"""``services.rollout`` entries (and ``training.agents.target``'s): the syntax of one gRPC target, checked
without resolving it, and a field that holds one address or a list of them.

Each entry is

* ``HOST:PORT`` (or ``[IPV6]:PORT``): one replica, always a member;
* ``dns:///NAME:PORT``: every address ``NAME`` resolves to is a replica (resolved again at every step by
  :mod:`trainer_service.rollout.replicas`: a Kubernetes headless Service lists its ready pods);
* ``unix:PATH`` (or another gRPC URI scheme except ``dns:``): one replica, passed to gRPC as it is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator

DNS_PREFIX = "dns:///"
# gRPC URI schemes other than dns: one channel, one replica (ipv4:/ipv6: lists are refused below).
PASS_THROUGH_SCHEMES = ("unix:", "unix-abstract:", "vsock:", "ipv4:", "ipv6:")


@dataclass(frozen=True)
class RolloutTarget:
    """One parsed ``services.rollout`` entry: a DNS name to resolve (``dns_name``/``port``) or a fixed one."""

    text: str
    dns_name: str | None = None
    port: int | None = None

    @property
    def dynamic(self) -> bool:
        """True when the replicas behind it change with DNS answers."""
        return self.dns_name is not None

    @property
    def has_host(self) -> bool:
        """True when its replicas are reached at a network host (HOST:PORT, dns:///), not a unix socket or
        another gRPC scheme."""
        return self.dynamic or not self.text.startswith(PASS_THROUGH_SCHEMES)


def _port(text: str, entry: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise ValueError(f"{entry!r} needs a port between 1 and 65535 after the last ':'")
    return int(text)


def parse_target(text: str) -> RolloutTarget:
    """Validate one ``services.rollout`` entry; ValueError says what is wrong with it."""
    if not isinstance(text, str) or not text:
        raise ValueError("must be a non-empty address (HOST:PORT or dns:///NAME:PORT)")
    if text != text.strip() or any(c.isspace() for c in text):
        raise ValueError(f"{text!r} contains white space")
    if "," in text:
        raise ValueError(f"{text!r} lists several addresses in one string; give a YAML list instead")
    if text.startswith("dns:"):
        if not text.startswith(DNS_PREFIX):
            raise ValueError(
                f"{text!r}: use dns:///NAME:PORT (three slashes; the system resolver, no DNS authority)"
            )
        host, sep, port = text.removeprefix(DNS_PREFIX).rpartition(":")
        if not sep or not host:
            raise ValueError(f"{text!r} needs NAME:PORT after dns:///")
        return RolloutTarget(text=text, dns_name=host.strip("[]"), port=_port(port, text))
    if text.startswith(PASS_THROUGH_SCHEMES):
        return RolloutTarget(text=text)
    host, sep, port = text.rpartition(":")
    if not sep or not host:
        raise ValueError(f"{text!r} is not HOST:PORT (or dns:///NAME:PORT)")
    if ":" in host and not (host.startswith("[") and host.endswith("]")):
        raise ValueError(f"{text!r}: write an IPv6 address in brackets, [ADDRESS]:PORT")
    _port(port, text)
    return RolloutTarget(text=text)


def address_list(value: Any) -> Any:
    """A field's one address as a list of one (checked here, so its error names the field), a list as it is
    (its entries checked by the field's type): a pydantic ``mode="before"`` validator."""
    if isinstance(value, str):
        parse_target(value)
        return [value]
    if value is not None and not isinstance(value, list):
        raise ValueError("must be an address (HOST:PORT or dns:///NAME:PORT) or a list of addresses")
    return value


def distinct_addresses(value: list[str] | None) -> list[str] | None:
    """``value`` unless it lists an address twice (ValueError naming both entries)."""
    if value is not None:
        for index, text in enumerate(value):
            if text in value[:index]:
                raise ValueError(f"lists {text!r} twice (entries {value.index(text)} and {index})")
    return value


def _checked_target(text: str) -> str:
    parse_target(text)
    return text


# One entry: HOST:PORT, [IPV6]:PORT, dns:///NAME:PORT or another gRPC URI (unix:PATH).
TargetText = Annotated[str, AfterValidator(_checked_target)]
# A field of one entry or a list of distinct entries, read as a list (None = unset).
TargetList = Annotated[
    list[TargetText] | None, BeforeValidator(address_list), AfterValidator(distinct_addresses)
]
