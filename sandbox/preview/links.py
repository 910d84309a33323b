"""Signed preview links: who may open which session's port, until when (docs/preview.md).

A link is `v1.<payload>.<mac>`: the payload (base64url JSON) names the tenant, the token that
made it, the session, the port, the sandbox it was made for (its container id) and the expiry;
the mac is HMAC-SHA256 over `v1.<payload>` with the service's preview key. Nothing in a link is
secret but the mac; nothing in it is believed before the mac is checked (in constant time), and
the text is bounded before it is decoded. The link is the whole credential of a browser that
opens it, so it lives in the URL's path: a page's relative links carry it, and no cookie of the
service's origin is ever needed (api/preview_routes.py says why that matters).
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import hmac
import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from sandbox.errors import ConfigError

VERSION = "v1"
MAX_LINK_CHARS = 2048  # a session key of 256 characters fits with room
KEY_BYTES = 32
KEY_FILE = "preview.key"


class LinkRefused(Exception):
    """A link that is not one of ours, was altered, or has expired (the message says which)."""


@dataclass(frozen=True)
class PreviewLink:
    """What a link grants: one tenant's session's port, in one sandbox, until `expires`."""

    tenant: str
    token: str  # the name of the tenant's token that made it (revoking the token ends the link)
    token_sha: str  # the start of that token's sha256: a token made again under the name is another
    agent: str
    session: str
    port: int
    sandbox: str  # the container id the session had when the link was made
    issued: float  # unix seconds (a session closed since then ends the link: preview/closed.py)
    expires: int  # unix seconds


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _mac(key: bytes, signed: str) -> str:
    return _b64(hmac.new(key, signed.encode(), hashlib.sha256).digest())


def sign(key: bytes, link: PreviewLink) -> str:
    """The link's text (URL-safe: it goes into a path)."""
    payload = _b64(json.dumps(asdict(link), separators=(",", ":"), ensure_ascii=True).encode())
    signed = f"{VERSION}.{payload}"
    return f"{signed}.{_mac(key, signed)}"


def verify(key: bytes, text: str, *, now: float | None = None) -> PreviewLink:
    """The grant `text` carries.

    Raises:
        LinkRefused: not a link, a wrong mac, a malformed payload, or expired.
    """
    if len(text) > MAX_LINK_CHARS:
        raise LinkRefused("not a preview link (too long)")
    parts = text.split(".")
    if len(parts) != 3 or parts[0] != VERSION:
        raise LinkRefused("not a preview link")
    signed = f"{parts[0]}.{parts[1]}"
    if not hmac.compare_digest(_mac(key, signed).encode(), parts[2].encode()):
        raise LinkRefused("the link's signature does not match (altered, or made with another key)")
    try:
        fields = json.loads(_unb64(parts[1]))
        link = PreviewLink(**fields)
    except (ValueError, TypeError, binascii.Error) as exc:  # signed by us, so never: a key mix-up
        raise LinkRefused(f"the link's payload is unreadable: {exc}") from None
    if not (isinstance(link.port, int) and isinstance(link.expires, int) and isinstance(link.issued, int | float)):
        raise LinkRefused("the link's payload is unreadable")
    if link.expires <= (time.time() if now is None else now):
        raise LinkRefused("the link has expired; ask for a new one")
    return link


def load_key(key_file: Path | None, state_dir: Path) -> bytes:
    """The key links are signed with: `service.preview_key_file`'s, else one made once in the
    state dir (mode 0600; only this host's processes know it).

    Raises:
        ConfigError: the key file is missing, unreadable, or shorter than 32 bytes.
    """
    if key_file is not None:
        try:
            key = key_file.read_bytes().strip()
        except OSError as exc:
            raise ConfigError([f"service.preview_key_file: cannot read {key_file}: {exc.strerror}"]) from None
        if len(key) < KEY_BYTES:
            raise ConfigError(
                [
                    f"service.preview_key_file: {key_file} holds {len(key)} bytes; a key of at least {KEY_BYTES} "
                    "random bytes is expected (for example: head -c 48 /dev/urandom | base64 > FILE)"
                ]
            )
        return key
    path = state_dir / KEY_FILE
    if not path.exists():
        # made whole beside it, then linked into place: a process that starts at the same
        # moment reads the one key that won, never a half-written file
        tmp = state_dir / f".{KEY_FILE}.{os.getpid()}.{os.urandom(4).hex()}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(os.urandom(KEY_BYTES))
                out.flush()
                os.fsync(out.fileno())
            with contextlib.suppress(FileExistsError):
                os.link(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
    key = path.read_bytes()
    if len(key) < KEY_BYTES:
        raise ConfigError([f"the preview key {path} is damaged ({len(key)} bytes): remove it"])
    return key
