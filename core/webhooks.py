"""Where the service may send a push notification: the URL policy and the address check, one rule for both ends.

The edge checks a webhook URL when a customer registers it (``check_url``, then ``check_host`` on what the host
resolves to now); the dispatcher checks again at every delivery (``resolve_checked``) and connects to the
address it checked, never to the name again, so a DNS answer that changes between the check and the connect
(DNS rebinding) cannot send the request elsewhere. Refused: anything but ``https`` (``http`` only to loopback,
and only with ``SPECIALISTS_PUSH_ALLOW_LOOPBACK``), user info in the URL, and every address that is not a
public unicast one: private (RFC 1918, ULA), loopback (unless allowed), link-local, shared (CGNAT),
multicast, reserved, unspecified, the cloud metadata addresses by name and by number, and every IPv6 form that
embeds a refused IPv4 address (IPv4-mapped, IPv4-compatible, 6to4, Teredo's server and client, NAT64's well-known
and local-use prefixes: ``embedded_ipv4``), since a relay or translator on the path would deliver it there. Redirects are never followed (``workers/dispatch/push.py``).
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from urllib.parse import urlsplit

from core.errors import ServiceError

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
# The metadata services of the clouds this could run on (GCE, AWS, Azure, Alibaba, Oracle), by number and name.
METADATA_ADDRESSES = frozenset(
    ipaddress.ip_address(a) for a in ("169.254.169.254", "fd00:ec2::254", "100.100.100.200", "192.0.0.192")
)
METADATA_NAMES = frozenset({"metadata.google.internal", "metadata.goog", "metadata", "instance-data"})
# Resolution runs in a small pool of its own: getaddrinfo cannot be interrupted, so a hung resolver costs a
# thread of this pool, never the caller's deadline.
_RESOLVERS = ThreadPoolExecutor(max_workers=8, thread_name_prefix="webhook-resolve")

Resolver = Callable[[str, int], list[str]]


class WebhookRefused(ServiceError):
    """A webhook URL or address this service will not call. ``code`` says why."""

    code = "webhook_refused"


@dataclass(frozen=True)
class Target:
    """A webhook URL taken apart: what is connected to and what is said to it."""

    url: str
    scheme: str
    host: str  # the name (or literal address) as written, lower-case, without brackets
    port: int
    path_and_query: str


def check_url(url: str, *, allow_loopback: bool, max_chars: int) -> Target:
    """The URL's form, or ``WebhookRefused``: https (http only to a loopback host when allowed), a host, no user info."""
    if len(url) > max_chars:
        raise WebhookRefused(
            f"the webhook URL has {len(url)} characters; at most {max_chars} are accepted (SPECIALISTS_PUSH_MAX_URL_CHARS)",
            code="webhook_url_invalid",
        )
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise WebhookRefused("the webhook URL cannot be parsed; send an absolute https:// URL",
                             code="webhook_url_invalid") from None
    host = (parts.hostname or "").lower()
    if parts.scheme not in ("https", "http") or not host:
        raise WebhookRefused("the webhook URL must be an absolute https:// URL with a host", code="webhook_url_invalid")
    if parts.username is not None or parts.password is not None:
        raise WebhookRefused("the webhook URL must not carry user info; use the configuration's authentication",
                             code="webhook_url_invalid")
    if parts.scheme == "http" and not (allow_loopback and _is_loopback_name(host)):
        raise WebhookRefused(
            "the webhook URL must use https (plain http is accepted only for loopback hosts in local development, "
            "SPECIALISTS_PUSH_ALLOW_LOOPBACK)",
            code="webhook_https_required",
        )
    if host.rstrip(".") in METADATA_NAMES:
        raise WebhookRefused("the webhook host is a cloud metadata service", code="webhook_address_refused")
    literal = _literal(host)
    if literal is not None:
        check_address(literal, allow_loopback=allow_loopback)
    path = parts.path or "/"
    return Target(url=url, scheme=parts.scheme, host=host, port=port or (443 if parts.scheme == "https" else 80),
                  path_and_query=path + (f"?{parts.query}" if parts.query else ""))


_NAT64_PREFIXES = (ipaddress.ip_network("64:ff9b::/96"), ipaddress.ip_network("64:ff9b:1::/48"))  # RFC 6052, 8215
_IPV4_COMPATIBLE = ipaddress.ip_network("::/96")  # RFC 4291's deprecated ::a.b.c.d (:: and ::1 are checked as IPv6)


def embedded_ipv4(address: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    """The IPv4 addresses an IPv6 address carries, in every form a relay or translator would deliver to.

    IPv4-mapped (``::ffff:a.b.c.d``), IPv4-compatible (``::a.b.c.d``), 6to4 (``2002:AABB:CCDD::/48``), Teredo
    (``2001::/32``: its server and its de-obfuscated client) and NAT64 (``64:ff9b::/96`` and the local-use
    ``64:ff9b:1::/48``, the IPv4 address in the last 32 bits, as RFC 6052's /96 form puts it).
    """
    found: list[ipaddress.IPv4Address] = []
    if address.ipv4_mapped is not None:
        found.append(address.ipv4_mapped)
    if address.sixtofour is not None:
        found.append(address.sixtofour)
    if address.teredo is not None:
        found.extend(address.teredo)
    last_32_bits = ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    if any(address in prefix for prefix in _NAT64_PREFIXES):
        found.append(last_32_bits)
    if address in _IPV4_COMPATIBLE and int(address) > 1:
        found.append(last_32_bits)
    return found


def check_address(address: IPAddress, *, allow_loopback: bool) -> None:
    """Refuse every address that is not public unicast (loopback only when allowed), and every IPv6 address that
    embeds a refused IPv4 one (``embedded_ipv4``), naming the IPv4 address and the form."""
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        else:
            for inner in embedded_ipv4(address):
                try:
                    check_address(inner, allow_loopback=False)
                except WebhookRefused as refused:
                    raise WebhookRefused(f"{address} embeds {refused.message}", code=refused.code) from None
            if address.sixtofour is not None:
                # 6to4 (2002::/16) is routed to the IPv4 address it embeds, which has just passed: that address
                # decides. The standard library's own table must not: Python before 3.11.4 (Debian bookworm's
                # 3.11.2, the image's) counts all of 2002::/16 as private, later ones as global.
                return
    if address in METADATA_ADDRESSES:
        raise WebhookRefused(f"{address} is a cloud metadata address", code="webhook_address_refused")
    if address.is_loopback:
        if allow_loopback:
            return
        raise WebhookRefused(f"{address} is a loopback address", code="webhook_address_refused")
    kind = (
        "link-local" if address.is_link_local
        else "multicast" if address.is_multicast
        else "unspecified" if address.is_unspecified
        else "private" if address.is_private or _is_shared(address)
        else "reserved" if address.is_reserved or not address.is_global
        else None
    )
    if kind is not None:
        raise WebhookRefused(f"{address} is a {kind} address", code="webhook_address_refused")


def system_resolver(host: str, port: int) -> list[str]:
    """Every address ``host`` resolves to now (TCP), as strings."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return sorted({info[4][0] for info in infos})


def resolve_checked(target: Target, *, allow_loopback: bool, timeout_s: float,
                    resolver: Resolver = system_resolver) -> IPAddress:
    """The address to connect to: the host resolved now, every answer checked; refuse if any is refused.

    All answers must pass, not only the first: a name that answers a public and a private address would
    otherwise reach the private one on a retry or another resolver's order.
    """
    literal = _literal(target.host)
    if literal is not None:
        check_address(literal, allow_loopback=allow_loopback)
        return literal
    future = _RESOLVERS.submit(resolver, target.host, target.port)
    try:
        answers = future.result(timeout=timeout_s)
    except FutureTimeout:
        raise WebhookRefused(
            f"resolving {target.host} took over {timeout_s:g} s (SPECIALISTS_PUSH_RESOLVE_TIMEOUT_S)",
            code="webhook_unresolved",
        ) from None
    except OSError:
        raise WebhookRefused(f"{target.host} does not resolve", code="webhook_unresolved") from None
    addresses = [ipaddress.ip_address(answer.split("%", 1)[0]) for answer in answers]
    if not addresses:
        raise WebhookRefused(f"{target.host} does not resolve", code="webhook_unresolved")
    for address in addresses:
        check_address(address, allow_loopback=allow_loopback)
    return addresses[0]


def _literal(host: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def _is_loopback_name(host: str) -> bool:
    literal = _literal(host)
    return literal.is_loopback if literal is not None else host.rstrip(".") in ("localhost",)


_SHARED = ipaddress.ip_network("100.64.0.0/10")  # carrier-grade NAT (RFC 6598): not global, not "private" either


def _is_shared(address: IPAddress) -> bool:
    return isinstance(address, ipaddress.IPv4Address) and address in _SHARED
