"""The after-sales operations agent: tickets resolved against a real SQLite company database,
with read/write separation, an evidence guardrail on every write and hand-off to humans."""

from lmpo.envs.aftersales.task import Aftersales

__all__ = ["Aftersales"]
