"""What every config model stands on: strict frozen models and paths relative to the config file.

Its own module so sections in files of their own (kubernetes.py) and models.py share it
without importing each other.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, ValidationInfo


class StrictModel(BaseModel):
    """Base: unknown keys are errors, instances are immutable."""

    # validators are built on first use: a start-up then builds only the models it validates
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)


def _resolve_path(value: Path, info: ValidationInfo) -> Path:
    # Relative paths mean "next to the config file"; `~` means the user's home.
    base = Path((info.context or {}).get("base_dir", Path.cwd()))
    expanded = Path(os.path.expanduser(str(value)))
    return expanded if expanded.is_absolute() else (base / expanded)


ConfigPath = Annotated[Path, AfterValidator(_resolve_path)]
