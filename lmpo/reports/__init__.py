"""Turn a run directory (``metrics.jsonl`` / pipeline ``summary.json``) into plots.

>>> from lmpo.reports import write_report
>>> write_report("runs/grpo-001")  # -> runs/grpo-001/report/report.html
"""

from .metrics import read_metrics
from .report import write_report

__all__ = ["read_metrics", "write_report"]
