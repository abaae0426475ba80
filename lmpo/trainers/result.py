"""What a training stage reports when it ends."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass
class StageResult:
    name: str
    seconds: float
    model_dir: str
    run_dir: str
    accuracy: float | None = None
    format_accuracy: float | None = None
    tool_call_rate: float | None = None
    """Held-out episodes that called a tool at least once (multi-turn tasks)."""
    terminations: dict[str, float] | None = None
    """Held-out episodes per termination reason (shares)."""
    breakdown: dict | None = None
    """Held-out hand-offs, environment tallies (guardrail blocks...) and figures per problem kind."""

    def write(self, path: str | Path, **extra) -> None:
        Path(path).write_text(json.dumps({**asdict(self), **extra}, indent=2, default=str))
