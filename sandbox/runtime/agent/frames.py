"""The resident agent's wire format, read as hostile input.

The agent (images/sandbox/sandbox_agent.py) runs next to untrusted code as the same user, so
anything on its stream may be forged. Every frame is bounded before it is buffered and
checked against a strict schema before it is believed; a frame that fails either check ends
the link (see runtime/agent/link.py), never the orchestrator.

Frame: 4-byte big-endian header length, 4-byte big-endian payload length, a JSON header, then
the payload. The same layout in both directions.
"""

from __future__ import annotations

import functools
import json
import struct
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

HEAD = struct.Struct(">II")
# what the agent may send: headers are a few numbers; payloads are output chunks of <= 64 KiB
MAX_HEADER = 4 << 10
MAX_PAYLOAD = 1 << 20
# what the agent accepts (sandbox_agent.py MAX_HEADER): a command and its environment
MAX_REQUEST = 8 << 20
STDERR_KEPT = 4 << 10  # the agent's own stderr (a traceback) is kept this far, for the log (transports)
MAX_INT = (1 << 63) - 1  # every number in a frame fits a signed 64-bit (no 4,000-digit sizes)


class FrameError(ValueError):
    """A frame broke the protocol: too large, not JSON, or not one of the known shapes."""


class _Frame(BaseModel):
    # built on first use, not at import: a CLI command that starts no agent does not pay for it
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True, defer_build=True)


class Hello(_Frame):
    t: Literal["hello"]
    id: Literal[0]
    protocol: int = Field(ge=0, le=MAX_INT)
    pid: int = Field(ge=1, le=MAX_INT)
    pidfd: bool
    ports: bool = False  # it carries connections to the sandbox's loopback ports (previews)


class Started(_Frame):
    t: Literal["started"]
    id: int = Field(ge=1, le=MAX_INT)
    pid: int = Field(ge=0, le=MAX_INT)


class Out(_Frame):
    t: Literal["out"]
    id: int = Field(ge=1, le=MAX_INT)
    stream: Literal[1, 2]


class Exit(_Frame):
    t: Literal["exit"]
    id: int = Field(ge=1, le=MAX_INT)
    code: int = Field(ge=0, le=255)
    signal: int = Field(ge=0, le=64)


class Reply(_Frame):
    t: Literal["pong", "done"]
    id: int = Field(ge=1, le=MAX_INT)


class Data(_Frame):
    t: Literal["data"]
    id: int = Field(ge=1, le=MAX_INT)


class FileInfo(_Frame):
    t: Literal["file"]
    id: int = Field(ge=1, le=MAX_INT)
    exists: bool
    size: int = Field(ge=0, le=MAX_INT)
    mtime_ns: int = Field(ge=0, le=MAX_INT)
    mode: int = Field(ge=0, le=0o177777)


class FileRefused(_Frame):
    t: Literal["ferror"]
    id: int = Field(ge=1, le=MAX_INT)
    errno: int = Field(ge=1, le=4095)
    why: Literal["", "symlink", "not_regular", "is_dir", "too_big", "the root itself"]
    size: int = Field(0, ge=0, le=MAX_INT)


class Failed(_Frame):
    t: Literal["error"]
    id: int = Field(ge=0, le=MAX_INT)
    message: str = Field(max_length=1000)


class PortOpened(_Frame):
    t: Literal["popened"]
    id: int = Field(ge=1, le=MAX_INT)


class PortRefused(_Frame):
    t: Literal["prefused"]
    id: int = Field(ge=1, le=MAX_INT)
    why: Literal["busy", "not_listening", "not_accepting", "not_owner"]
    message: str = Field(max_length=300)


class PortData(_Frame):
    t: Literal["pdata"]
    id: int = Field(ge=1, le=MAX_INT)


class PortAck(_Frame):
    t: Literal["pack"]
    id: int = Field(ge=1, le=MAX_INT)
    n: int = Field(ge=1, le=MAX_INT)


class PortClosed(_Frame):
    t: Literal["pclosed"]
    id: int = Field(ge=1, le=MAX_INT)


PortFrame = PortOpened | PortRefused | PortData | PortAck | PortClosed
PORT_FRAMES = (PortOpened, PortRefused, PortData, PortAck, PortClosed)
Frame = Annotated[
    Hello | Started | Out | Exit | Reply | Failed | Data | FileInfo | FileRefused | PortFrame,
    Field(discriminator="t"),
]


@functools.cache
def _frame_adapter() -> TypeAdapter[Frame]:
    return TypeAdapter(Frame)


def encode(header: dict[str, Any], payload: bytes = b"") -> bytes:
    """One request frame."""
    head = json.dumps(header, separators=(",", ":")).encode()
    if len(head) + len(payload) > MAX_REQUEST:
        raise FrameError(f"the request is {len(head) + len(payload)} bytes; the agent takes at most {MAX_REQUEST}")
    return HEAD.pack(len(head), len(payload)) + head + payload


class FrameReader:
    """Turns the bytes of the agent's stdout into checked frames.

    `feed` takes what a transport received (runtime/agent/transport.py: the engine's own stream
    framing is already gone) and returns the complete agent frames in them; FrameError on the
    first broken one. Sizes are checked from the headers, before a body is waited for, so a
    forged 1 GB length costs nothing.
    """

    def __init__(self) -> None:
        self._inbox = bytearray()

    def feed(self, data: bytes) -> list[tuple[Frame, bytes]]:
        """The complete frames `data` ends; FrameError on a broken one."""
        self._inbox += data
        if len(self._inbox) > HEAD.size + MAX_HEADER + MAX_PAYLOAD:
            self._check_head()  # raises: nothing legitimate is this long
        return self._frames()

    def _check_head(self) -> tuple[int, int]:
        head_len, payload_len = HEAD.unpack_from(self._inbox)
        if head_len > MAX_HEADER or payload_len > MAX_PAYLOAD:
            raise FrameError(
                f"the agent announced a frame of {head_len} + {payload_len} bytes, over the limits "
                f"({MAX_HEADER} + {MAX_PAYLOAD})"
            )
        return head_len, payload_len

    def _frames(self) -> list[tuple[Frame, bytes]]:
        out: list[tuple[Frame, bytes]] = []
        while len(self._inbox) >= HEAD.size:
            head_len, payload_len = self._check_head()
            end = HEAD.size + head_len + payload_len
            if len(self._inbox) < end:
                break
            head = bytes(self._inbox[HEAD.size : HEAD.size + head_len])
            payload = bytes(self._inbox[HEAD.size + head_len : end])
            del self._inbox[:end]
            try:
                frame = _frame_adapter().validate_json(head)
            except ValidationError as exc:
                raise FrameError(f"the agent sent a frame that is not in the protocol: {_short(exc)}") from None
            if payload and not isinstance(frame, (Out, Data, PortData)):
                raise FrameError(f"the agent sent a payload with a {frame.t!r} frame")
            out.append((frame, payload))
        return out


def _short(exc: ValidationError) -> str:
    first = exc.errors()[0]
    where = ".".join(str(p) for p in first.get("loc", ())) or "frame"
    return f"{where}: {first.get('msg', 'invalid')}"
