"""The one place where docker SDK and transport exceptions become SandboxErrors."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import docker.errors
import requests.exceptions

from sandbox.errors import ErrorCode, SandboxError, SandboxUnavailable


@contextmanager
def mapped(action: str) -> Iterator[None]:
    """Re-raise foreign exceptions from the engine as SandboxErrors (`from exc`).

    `docker.errors.NotFound` passes through: callers treat "missing" as data.
    """
    try:
        yield
    except SandboxError:
        raise
    except docker.errors.ImageNotFound as exc:
        raise SandboxUnavailable(
            f"{action}: image not found ({exc.explanation}); run `sandbox images build`",
            hint="sandbox images build",
        ) from exc
    except docker.errors.NotFound:
        raise
    except docker.errors.APIError as exc:
        status = exc.status_code or 0
        if status == 409:
            raise SandboxError(ErrorCode.CONFLICT, f"{action}: {exc.explanation}") from exc
        if status >= 500 or status == 0:
            raise SandboxUnavailable(f"{action}: the Docker engine failed: {exc.explanation}") from exc
        raise SandboxError(ErrorCode.INTERNAL, f"{action}: the Docker engine refused: {exc.explanation}") from exc
    except (
        requests.exceptions.ConnectionError,
        requests.exceptions.Timeout,
        ConnectionError,
    ) as exc:
        raise SandboxUnavailable(f"{action}: the Docker engine is unreachable ({exc.__class__.__name__})") from exc
    except docker.errors.DockerException as exc:
        raise SandboxUnavailable(f"{action}: the Docker engine is unreachable or misconfigured: {exc}") from exc
