"""Fetching an http(s) image URL safely (server/api/media.py decodes what comes back).

Fetches refuse loopback/private/link-local/reserved addresses: every resolved
address, every redirect hop, and again at connect time when this module owns the
HTTP client (closing the DNS-rebinding gap between check and connect), unless
`allow_private` is set. The body is limited to `max_bytes` while it streams, and
the whole fetch (all hops) to `fetch_timeout`.
"""
from __future__ import annotations

import asyncio
import ipaddress
import socket

import httpx

from ggserve.server.api.media import MediaConfig, MediaError, _human

_USER_AGENT = "ggserve-media-fetch/0.1"


def _refused(url, why: str) -> MediaError:
    return MediaError(f"Image URL {url} refused: {why}.", "invalid_image_url")


def _host_allowed(host: str, allowed: list[str]) -> bool:
    host = host.rstrip(".").lower()
    for d in allowed:
        d = d.strip().lower().rstrip(".")
        if d.startswith("*."):
            d = d[2:]
        d = d.lstrip(".")
        if not d:
            continue
        try:
            d = d.encode("idna").decode("ascii")
        except UnicodeError:
            pass
        if host == d or host.endswith("." + d):
            return True
    return False


_NAT64 = ipaddress.ip_network("64:ff9b::/96")


def _address_refused(addr: str) -> str | None:
    """Why an IP address is not publicly routable (None if it is)."""
    ip = ipaddress.ip_address(addr.split("%", 1)[0])
    candidates = [ip]
    if ip.version == 6:
        # IPv4 embedded in IPv6: mapped and NAT64 addresses are judged by their IPv4 address
        # (Python < 3.13 calls every ::ffff:a.b.c.d private), 6to4 by both
        if ip.ipv4_mapped is not None:
            candidates = [ip.ipv4_mapped]
        elif ip in _NAT64:
            candidates = [ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)]
        elif ip.sixtofour is not None:
            candidates.append(ip.sixtofour)
    for a in candidates:
        for attr in ("is_loopback", "is_private", "is_link_local", "is_reserved",
                     "is_multicast", "is_unspecified"):
            if getattr(a, attr):
                return f"{addr} is a {attr[3:].replace('_', '-')} address"
        if not a.is_global:
            return f"{addr} is not a globally routable address"
    return None


async def _resolve_checked(host: str, port: int, url) -> list[str]:
    """All addresses of `host`, each checked; MediaError if any is not public."""
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(
            host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError, OSError) as e:
        raise MediaError(f"Could not resolve the image URL's host {host!r}: {e}",
                         "invalid_image_url") from None
    addrs = []
    for family, _, _, _, sockaddr in infos:
        if family not in (socket.AF_INET, socket.AF_INET6):
            continue
        a = sockaddr[0]
        why = _address_refused(a)
        if why:
            raise _refused(url, why + " (private and local addresses are not fetched)")
        if a not in addrs:
            addrs.append(a)
    if not addrs:
        raise MediaError(f"Could not resolve the image URL's host {host!r}.",
                         "invalid_image_url")
    return addrs


def _check_url(url: httpx.URL, config: MediaConfig) -> str:
    if url.scheme not in ("http", "https"):
        raise _refused(url, "only http and https URLs are fetched")
    host = url.raw_host.decode("ascii", "replace")
    if not host:
        raise _refused(url, "no host")
    if config.allowed_domains is not None and not _host_allowed(host, config.allowed_domains):
        raise _refused(url, f"host {host} is not in the allowed media domains")
    return host


class _GuardedBackend:
    """httpcore network backend that resolves, checks every address and connects to a checked
    one, so a DNS answer that changes between the check and the connect is still caught."""

    def __init__(self):
        import httpcore
        self._inner = httpcore.AnyIOBackend()

    async def connect_tcp(self, host, port, timeout=None, local_address=None,
                          socket_options=None):
        addrs = await _resolve_checked(host, port, f"{host}:{port}")
        last: Exception | None = None
        for a in addrs:
            try:
                return await self._inner.connect_tcp(a, port, timeout=timeout,
                                                     local_address=local_address,
                                                     socket_options=socket_options)
            except Exception as e:  # noqa: BLE001 - try the next address
                last = e
        assert last is not None
        raise last

    async def connect_unix_socket(self, *a, **k):
        raise OSError("unix sockets are not used for media fetches")

    async def sleep(self, seconds):
        await self._inner.sleep(seconds)


def _make_client(config: MediaConfig) -> httpx.AsyncClient:
    # no env proxies: the address checks must see the real destination
    transport = httpx.AsyncHTTPTransport(retries=0)
    if not config.allow_private:
        try:
            import httpcore
            pool = transport._pool
            transport._pool = httpcore.AsyncConnectionPool(
                ssl_context=pool._ssl_context, max_connections=4,
                network_backend=_GuardedBackend())
        except Exception:  # pragma: no cover - httpx internals changed: per-hop checks remain
            pass
    return httpx.AsyncClient(transport=transport, trust_env=False, follow_redirects=False,
                             timeout=config.fetch_timeout)


async def fetch(url: str, config: MediaConfig,
                 client: httpx.AsyncClient | None) -> tuple[bytes, str | None]:
    try:
        current = httpx.URL(url)
    except Exception as e:  # noqa: BLE001 - httpx.InvalidURL and friends
        raise MediaError(f"Invalid image URL: {e}", "invalid_image_url") from None
    own = client is None
    if own:
        client = _make_client(config)
    try:
        return await asyncio.wait_for(_fetch_hops(client, current, config),
                                      timeout=config.fetch_timeout)
    except asyncio.TimeoutError:
        raise MediaError(f"Fetching the image timed out after {config.fetch_timeout:g} s.",
                         "invalid_image_url") from None
    finally:
        if own:
            await client.aclose()


async def _fetch_hops(client: httpx.AsyncClient, url: httpx.URL,
                      config: MediaConfig) -> tuple[bytes, str | None]:
    headers = {"User-Agent": _USER_AGENT, "Accept": "image/*",
               "Accept-Encoding": "identity"}
    for hop in range(config.max_redirects + 1):
        host = _check_url(url, config)
        if not config.allow_private:
            await _resolve_checked(host, url.port or (443 if url.scheme == "https" else 80),
                                   url)
        try:
            async with client.stream("GET", url, headers=headers, follow_redirects=False,
                                     timeout=config.fetch_timeout) as r:
                if r.is_redirect:
                    loc = r.headers.get("location")
                    if hop == config.max_redirects:
                        raise MediaError(f"Fetching the image: more than {config.max_redirects}"
                                         " redirects.", "invalid_image_url")
                    try:
                        url = r.url.join(loc)
                    except Exception:  # noqa: BLE001
                        raise MediaError(f"Fetching the image: bad redirect location {loc!r}.",
                                         "invalid_image_url") from None
                    continue
                if not r.is_success:
                    raise MediaError(f"Fetching the image failed: {url} returned HTTP "
                                     f"{r.status_code}.", "invalid_image_url")
                n = r.headers.get("content-length")
                if n is not None and n.strip().isdigit() and int(n) > config.max_bytes:
                    raise MediaError(f"Image at {url} is {_human(int(n))}, larger than the "
                                     f"limit of {_human(config.max_bytes)}.", "image_too_large")
                buf = bytearray()
                async for chunk in r.aiter_bytes():
                    buf += chunk
                    if len(buf) > config.max_bytes:
                        raise MediaError(f"Image at {url} is larger than the limit of "
                                         f"{_human(config.max_bytes)}.", "image_too_large")
                return bytes(buf), r.headers.get("content-type")
        except MediaError:
            raise
        except httpx.TimeoutException:
            raise MediaError(f"Fetching the image timed out after {config.fetch_timeout:g} s.",
                             "invalid_image_url") from None
        except (httpx.HTTPError, OSError) as e:
            raise MediaError(f"Fetching the image failed: {type(e).__name__}: {e}",
                             "invalid_image_url") from None
    raise AssertionError("unreachable")
