"""Tools an agent can call during an episode: typed functions with JSON schemas (`tool`), a
safe calculator, a sandboxed Python runner, BM25 search over a local corpus and read-only SQL.
A refused call raises ToolError, whose message becomes the model's observation; a tool
that overran its time limit raises ToolTimeout, which ends the episode."""

from lmpo.envs.tools.calculator import CALCULATOR, calculate
from lmpo.envs.tools.python_tool import make_python_tool
from lmpo.envs.tools.schema import BadArguments, Tool, ToolCrash, ToolError, ToolTimeout, tool
from lmpo.envs.tools.search import SearchIndex, make_search_tools
from lmpo.envs.tools.sql import ReadOnlySQL, make_sql_tool

__all__ = ["BadArguments", "CALCULATOR", "ReadOnlySQL", "SearchIndex", "Tool", "ToolCrash", "ToolError", "ToolTimeout",
           "calculate", "make_python_tool", "make_search_tools", "make_sql_tool", "tool"]
