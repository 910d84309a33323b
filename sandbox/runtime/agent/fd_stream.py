"""A duplex byte stream over two non-blocking file descriptors, woken by the event loop (no
thread): the shared half of the agent transports that read and write plain fds (a local
subprocess's pipes, runtime/agent/pipe.py; the FIFO link, runtime/agent/fifo_link.py)."""

from __future__ import annotations

import os
import select

import anyio


class FdDuplex:
    """Reads `read_fd`, writes `write_fd` (both set non-blocking). Its owner closes the fds,
    after :meth:`_mark_closed`."""

    def __init__(self, read_fd: int, write_fd: int) -> None:
        self._read_fd, self._write_fd = read_fd, write_fd
        for fd in (read_fd, write_fd):
            os.set_blocking(fd, False)
        self._closed = False

    def _check_open(self) -> None:
        # Plain fd numbers, unlike a socket object: once closed, the number is the next open's
        # (another agent's FIFO or pipe). A wait already woken when `close` ran must not touch it.
        if self._closed:
            raise anyio.ClosedResourceError

    async def receive(self, max_bytes: int) -> bytes:
        while True:
            self._check_open()
            await anyio.wait_readable(self._read_fd)
            self._check_open()
            try:
                return os.read(self._read_fd, max_bytes)  # b"": every writer is gone
            except BlockingIOError:
                continue

    async def send(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            self._check_open()
            try:
                sent = os.write(self._write_fd, view)
            except BlockingIOError:
                await anyio.wait_writable(self._write_fd)
                continue
            view = view[sent:]

    def send_nowait(self, data: bytes) -> int:
        self._check_open()
        try:
            return os.write(self._write_fd, data)
        except BlockingIOError:
            return 0

    def _hung_up(self) -> bool:
        """Whether the read end has no data left and no writer (without consuming anything)."""
        if self._closed:
            return True
        poller = select.poll()  # not select(): a busy host has fds past 1024
        poller.register(self._read_fd, select.POLLIN)
        events = dict(poller.poll(0)).get(self._read_fd, 0)
        return bool(events & select.POLLHUP) and not events & select.POLLIN

    def _mark_closed(self) -> bool:
        """Mark the stream closed and wake whoever waits on its fds (ClosedResourceError); False
        when it was closed already."""
        if self._closed:
            return False
        self._closed = True
        for fd in (self._read_fd, self._write_fd):
            anyio.notify_closing(fd)
        return True
