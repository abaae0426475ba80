"""Users' own data: SFT and continued pre-training examples, preference pairs and RL prompt
sets, read from JSONL, Parquet or a directory saved with `datasets` `save_to_disk`.

Every loader checks every row before returning and raises `DataError` naming the file, the
row (the line number in JSONL) and the field. Examples longer than `max_length` follow the
`overlong` policy: "error" (the default), "skip", or "truncate" (keep the start); the
returned `LoadReport` counts what was skipped and truncated.
"""

from lmpo.envs.data.preferences import PreferencePair, load_preferences
from lmpo.envs.data.prompts import load_prompts
from lmpo.envs.data.records import DataError, Record, read_records
from lmpo.envs.data.report import LoadReport, Overlong
from lmpo.envs.data.sft import TokenizedExample, load_sft, pack

__all__ = ["DataError", "LoadReport", "Overlong", "PreferencePair", "Record", "TokenizedExample", "load_preferences",
           "load_prompts", "load_sft", "pack", "read_records"]
