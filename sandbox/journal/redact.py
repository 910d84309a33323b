"""Masking secrets before anything is journaled: by key name and by value shape."""

from __future__ import annotations

import re
from typing import Any

SECRET_KEYS = re.compile(r"(pass(word)?|secret|token|api[_-]?key|auth|credential|private[_-]?key|cookie)", re.I)
SECRET_VALUES = [
    re.compile(r"AKIA[0-9A-Z]{16}"),  # AWS access key id
    re.compile(r"(sk|pk|rk)-[A-Za-z0-9_-]{16,}"),  # OpenAI/Stripe style keys
    re.compile(r"gh[pousr]_[A-Za-z0-9]{20,}"),  # GitHub tokens
    re.compile(r"xox[abpr]-[A-Za-z0-9-]{10,}"),  # Slack tokens
    re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?-----END [A-Z ]*PRIVATE KEY-----", re.S),
    re.compile(r"(?i)bearer\s+[A-Za-z0-9._~+/=-]{12,}"),
    re.compile(r"eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"),  # JWT
]
MASK = "***"
MAX_TEXT = 2000


def redact(value: Any, *, key: str = "") -> Any:
    """A copy of `value` with secrets masked and long text shortened."""
    if key and SECRET_KEYS.search(key) and not isinstance(value, dict | list):
        return MASK
    if isinstance(value, dict):
        return {k: redact(v, key=str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [redact(v) for v in value]
    if isinstance(value, str):
        text = value
        for pattern in SECRET_VALUES:
            text = pattern.sub(MASK, text)
        if len(text) > MAX_TEXT:
            text = text[:MAX_TEXT] + f"... [{len(text) - MAX_TEXT} more characters]"
        return text
    return value
