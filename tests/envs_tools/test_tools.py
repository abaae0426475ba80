"""Agent tools: schemas from typed functions, argument checking, the calculator, the sandboxed
Python tool, BM25 search over a local corpus and read-only SQL."""

import hashlib
import json
import re
import sqlite3
import subprocess
import sys
import threading
import time
from typing import Literal, Optional

import pytest

from lmpo.envs.sandbox import SandboxError, SandboxLimits, run_python
from lmpo.envs.tools import (CALCULATOR, ReadOnlySQL, SearchIndex, Tool, ToolError, ToolTimeout, calculate,
                             make_python_tool, make_search_tools, make_sql_tool, tool)


def weather(city: str, unit: Literal["c", "f"] = "c", days: int = 1, scale: float = 1.0,
            tags: Optional[list[str]] = None, verbose: bool = False) -> str:
    """Look up the weather
    for a city.

    Not part of the description.

    Args:
        city: The city name.
        unit: Temperature unit,
            celsius or fahrenheit.
        days (int): How many days.

    Returns:
        A summary.
    """
    return f"{city}|{unit}|{days}|{scale!r}|{tags}|{verbose}"


WEATHER = tool(weather)


def test_schema_from_a_typed_function():
    assert WEATHER.schema() == {"type": "function", "function": {
        "name": "weather", "description": "Look up the weather for a city.",
        "parameters": {"type": "object", "required": ["city"], "properties": {
            "city": {"type": "string", "description": "The city name."},
            "unit": {"type": "string", "enum": ["c", "f"], "description": "Temperature unit, celsius or fahrenheit."},
            "days": {"type": "integer", "description": "How many days."},
            "scale": {"type": "number"},
            "tags": {"type": "array", "items": {"type": "string"}, "nullable": True},
            "verbose": {"type": "boolean"}}}}}
    assert list(WEATHER.parameters["properties"]) == ["city", "unit", "days", "scale", "tags", "verbose"]


def test_tool_forms_and_definition_errors():
    @tool
    def plain(x: int | None) -> int:
        return x

    @tool(name="renamed")
    def other(x: str) -> str:
        return x

    assert isinstance(plain, Tool) and plain.parameters["properties"]["x"] == {"type": "integer", "nullable": True}
    assert plain.call({"x": None}) == "None" and other.name == "renamed" and other.description == ""
    with pytest.raises(TypeError, match="'y'.*no type annotation"):
        tool(lambda y: y)
    with pytest.raises(TypeError, match="'z': unsupported annotation"):
        def raw(z: bytes) -> bytes:
            return z
        tool(raw)
    with pytest.raises(TypeError, match=r"\*args"):
        def variadic(*xs: int) -> int:
            return 0
        tool(variadic)


def test_an_async_function_is_refused_as_a_tool():
    """Before: `@tool async def` built a tool whose every call returned the coroutine, so the model
    saw '<coroutine object fetch at 0x...>' as a successful call's result."""
    async def fetch(url: str) -> str:
        return url

    async def stream(url: str):
        yield url

    message = ("tool 'fetch' is an async function; tools must be plain (synchronous) functions that return "
               "their result (run a coroutine to completion inside one, e.g. asyncio.run)")
    with pytest.raises(TypeError, match=f"^{re.escape(message)}$"):
        tool(fetch)
    with pytest.raises(TypeError, match="^tool 'pages' is an async function"):
        tool(stream, name="pages")


def test_arguments_are_checked():
    assert WEATHER.call({"city": "Oslo", "days": 2, "scale": 3, "tags": ["a"], "verbose": True}) \
        == "Oslo|c|2|3.0|['a']|True"  # an int is accepted (and widened) for a float
    bad = [({"city": "Oslo", "color": "red"}, "unknown argument 'color'; expected: city, unit"),
           ({"days": 2}, "missing required argument 'city' (a string)"),
           ({"city": "Oslo", "days": "2"}, "argument 'days' must be an integer, got string '2'"),
           ({"city": "Oslo", "days": 2.5}, "argument 'days' must be an integer, got number 2.5"),
           ({"city": "Oslo", "days": True}, "argument 'days' must be an integer, got boolean True"),
           ({"city": "Oslo", "scale": "1.5"}, "argument 'scale' must be a number, got string '1.5'"),
           ({"city": "Oslo", "unit": "k"}, "argument 'unit' must be one of 'c', 'f', got string 'k'"),
           ({"city": "Oslo", "tags": ["a", 1]}, r"argument 'tags'\[1\] must be a string, got integer 1"),
           ({"city": 7}, "argument 'city' must be a string, got integer 7")]
    for arguments, message in bad:
        with pytest.raises(ToolError, match=message.replace("(", r"\(").replace(")", r"\)")):
            WEATHER.call(arguments)
    with pytest.raises(ToolError, match="arguments must be a JSON object, got array"):
        WEATHER.call(["Oslo"])


def test_exceptions_of_the_function_become_tool_errors():
    def divide(a: float, b: float) -> float:
        """Divide."""
        if b == 1:
            raise ToolError("b must not be 1")
        return a / b

    assert tool(divide).call({"a": 1, "b": 4}) == "0.25"
    with pytest.raises(ToolError, match="^ZeroDivisionError: float division by zero$"):
        tool(divide).call({"a": 1, "b": 0})
    with pytest.raises(ToolError, match="^b must not be 1$"):
        tool(divide).call({"a": 1, "b": 1})


def test_call_text_compact_forms():
    assert CALCULATOR.call_text("3*(4+5)") == "27"  # one required str parameter: the whole text
    assert WEATHER.call_text('city="Paris", days=2') == 'city="Paris", days=2|c|1|1.0|None|False'

    @tool
    def book(city: str, nights: int, breakfast: bool = False, rooms: list[int] | None = None) -> str:
        return f"{city}|{nights}|{breakfast}|{rooms}"

    assert book.call_text('city="Paris", nights=2') == "Paris|2|False|None"
    assert book.call_text("'Oslo', 3, rooms=(1, 2), breakfast=True") == "Oslo|3|True|[1, 2]"

    @tool
    def pair(a: int, b: int = 0) -> int:
        return a + b

    assert pair.call_text("1, b=2") == "3" and pair.call_text(" 4 ") == "4"
    refused = {"a=x": "must be a literal", "a=1, a=2": "given twice", "1, 2, 3": "takes 2 argument",
               "**{'a': 1}": r"\* and \*\*", "a=": "cannot parse", "1), print(2": "cannot parse",
               "a=__import__('os')": "must be a literal", "": "missing required argument 'a'",
               "'1'": "must be an integer, got string '1'"}
    for text, message in refused.items():
        with pytest.raises(ToolError, match=message):
            pair.call_text(text)


@pytest.mark.parametrize("expression, result", [
    ("8731*9462", "82612722"), ("37*48+5", "1781"), ("2+3*4", "14"), ("(2+3)*4", "20"), ("6/3", "2"),
    ("7/2", "3.5"), ("-2**2", "-4"), ("2**-1", "0.5"), ("7//2", "3"), ("-7//2", "-4"), ("7%3", "1"),
    ("0.1+0.2", "0.30000000000000004"), ("1.5*2", "3"), ("10**50/10**10", "1" + "0" * 40),
    ("123456789*987654321*111", str(123456789 * 987654321 * 111)), (" --3 ", "3"), ("2**100", str(2**100))])
def test_calculator_results(expression, result):
    assert calculate(expression) == result


@pytest.mark.parametrize("expression, message", [
    ("x+1", "names are not allowed"), ("__import__('os').system('ls')", "function calls are not allowed"),
    ("(1).real", "attribute access is not allowed"), ("'a'*3", "strings are not allowed"),
    ("2**1000", "exponent too large"), ("(10**50)**50", "more than 1000 digits"),
    ("2**2**2**2**2", "exponent too large"), ("9**100*" * 24 + "1", "more than 1000 digits"),
    ("1/0", "division by zero"), ("5//0", "division by zero"), ("5.0%0", "division by zero"),
    ("1" * 201, "expression too long"), ("2^3", "write powers with \\*\\*"), ("1e400", "too large"),
    ("(-8)**0.5", "not a real number"), ("3 +", "invalid expression"), ("", "empty expression"),
    ("[1, 2]", "List is not allowed"), ("1 < 2", "Compare is not allowed"), ("1j", "complex")])
def test_calculator_refusals(expression, message):
    with pytest.raises(ToolError, match=message):
        calculate(expression)


def test_calculator_tool_schema():
    schema = CALCULATOR.schema()["function"]
    assert schema["name"] == "calculator" and schema["parameters"]["required"] == ["expression"]


@pytest.fixture(scope="module")
def python_tool():
    try:
        run_python("pass", limits=SandboxLimits(wall_s=5))
    except SandboxError as error:
        pytest.skip(f"sandbox unavailable here: {error}")
    return make_python_tool(SandboxLimits(wall_s=1.0, cpu_s=5.0, memory_mb=512), max_output_chars=100)


def test_python_tool_output_errors_and_clipping(python_tool):
    assert python_tool.name == "python" and list(python_tool.parameters["properties"]) == ["code"]
    assert python_tool.call({"code": "print(6 * 7)"}) == "42"
    assert python_tool.call({"code": "import sys\nprint('a')\nprint('b', file=sys.stderr)"}) == "a\nstderr:\nb"
    raised = python_tool.call({"code": "raise ValueError('boom')"})
    assert raised.startswith("stderr:\nTraceback") and raised.endswith("[exit code 1]")
    assert python_tool.call({"code": "x = 1"}) == "(no output)"
    clipped = python_tool.call({"code": "print('x' * 5000)"})
    assert clipped == "x" * 100 + "…[clipped 4900 chars]"


def test_python_tool_timeout(python_tool):
    start = time.monotonic()
    with pytest.raises(ToolTimeout, match="^timeout: the program ran past 1 s"):
        python_tool.call({"code": "print('started', flush=True)\nwhile True:\n    pass"})
    assert time.monotonic() - start < 5


CORPUS = [{"id": "paris", "title": "Paris", "text": "Paris is the capital and largest city of France."},
          {"id": "berlin", "title": "Berlin", "text": "Berlin is the capital of Germany, on the river Spree."},
          {"id": "python", "title": "Python (language)", "text": "Python is a programming language. " * 200},
          {"id": "everest", "title": "Mount Everest", "text": "Everest is Earth's highest mountain above sea level."}]


@pytest.fixture(scope="module")
def index():
    return SearchIndex(CORPUS)


def test_search_ranks_the_relevant_document_first(index):
    hits = index.search("capital of Germany")
    assert [doc_id for doc_id, _, _ in hits] == ["berlin", "paris"] and hits[0][2] > hits[1][2] > 0
    assert index.search("HIGHEST mountain", k=1)[0][:2] == ("everest", "Mount Everest")
    assert index.search("quantum chromodynamics") == [] and index.search("the of") == []
    assert len(index.search("is", k=10)) <= 4
    with pytest.raises(ToolError, match="empty query"):
        index.search("   ")


def test_search_and_open_tools(index):
    search, open_ = make_search_tools(index, max_chars=200)
    assert (search.name, open_.name) == ("search", "open")
    assert search.call({"query": "largest city in France"}) == "1. paris: Paris"
    assert search.call({"query": "zebra"}) == "no results for 'zebra'"
    assert open_.call({"doc_id": "paris"}) == "Paris\nParis is the capital and largest city of France."
    long = open_.call({"doc_id": "python"})
    full = "Python (language)\n" + CORPUS[2]["text"]
    assert long == f"{full[:200]}…[clipped {len(full) - 200} chars]"
    with pytest.raises(ToolError, match="unknown document id 'tokyo'"):
        open_.call({"doc_id": "tokyo"})
    with pytest.raises(ToolError, match="empty query"):
        search.call({"query": ""})


def test_search_index_from_jsonl_and_located_errors(tmp_path):
    good = tmp_path / "good.jsonl"
    good.write_text("\n".join(json.dumps(doc) for doc in CORPUS) + "\n\n")
    assert len(SearchIndex.from_jsonl(good)) == 4
    rows = {"bad_json": ['{"id": "a", "title": "A", "text": "x"}', '{"id": "b",'],
            "missing": ['{"id": "a", "title": "A", "text": "x"}', "", '{"id": "b", "text": "y"}'],
            "type": ['{"id": "a", "title": "A", "text": 3}'], "array": ['["a", "A", "x"]'],
            "duplicate": ['{"id": "a", "title": "A", "text": "x"}', '{"id": "a", "title": "B", "text": "y"}']}
    expected = {"bad_json": r"bad_json.jsonl:2: invalid JSON", "missing": r"missing.jsonl:3: missing field 'title'",
                "type": r"type.jsonl:1: field 'text' must be a string, got int",
                "array": r"array.jsonl:1: expected a JSON object", "duplicate": "document 1: duplicate id 'a'"}
    for name, lines in rows.items():
        path = tmp_path / f"{name}.jsonl"
        path.write_text("\n".join(lines) + "\n")
        with pytest.raises(ValueError, match=expected[name]):
            SearchIndex.from_jsonl(path)
    with pytest.raises(ValueError, match="at least one document"):
        SearchIndex([])


@pytest.fixture()
def database(tmp_path):
    path = tmp_path / "shop.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE items (id INTEGER PRIMARY KEY, name TEXT, price REAL, note TEXT)")
        conn.executemany("INSERT INTO items VALUES (?, ?, ?, ?)",
                         [(i, f"item{i}", i * 1.5, None if i % 2 else "a\nb") for i in range(1, 121)])
    conn.close()
    return path


def test_sql_tables_and_row_cap(database):
    with ReadOnlySQL(database, max_rows=3) as db:
        sql = make_sql_tool(db)
        assert sql.name == "sql" and make_sql_tool(db, name="db").name == "db"
        assert sql.call({"query": "SELECT id, name, price, note FROM items WHERE id <= 2;"}) \
            == "id|name|price|note\n1|item1|1.5|NULL\n2|item2|3.0|a\\nb"
        assert sql.call({"query": "SELECT * FROM items"}).endswith("3|item3|4.5|NULL\n…[117 more rows cut]")
        assert sql.call({"query": "-- total\nWITH t AS (SELECT price FROM items) SELECT count(*) AS n FROM t"}) \
            == "n\n120"
        assert sql.call({"query": "SELECT * FROM items WHERE id > 1000"}) == "id|name|price|note\n(no rows)"
        assert "CREATE TABLE items" in db.schema_text()
        with pytest.raises(ToolError, match="no such table: nope"):
            sql.call({"query": "SELECT * FROM nope"})
        assert ReadOnlySQL(database, max_chars=30).query("SELECT * FROM items").endswith("chars]")


def test_sql_refuses_writes_and_leaves_the_file_unchanged(database, tmp_path):
    before = hashlib.sha256(database.read_bytes()).hexdigest()
    db = ReadOnlySQL(database)
    refused = {"INSERT INTO items (name) VALUES ('x')": "not INSERT",
               f"ATTACH '{tmp_path / 'other.db'}' AS other": "not ATTACH",
               "PRAGMA writable_schema = ON": "not PRAGMA", "DROP TABLE items": "not DROP",
               "WITH t AS (SELECT 1) DELETE FROM items": "not authorized",
               "SELECT 1; DELETE FROM items": "one statement at a time",
               "SELECT 'unclosed": "incomplete SQL statement", "SELECT zeroblob(1000000000)": "too big",
               "SELECT load_extension('x')": "not authorized", "": "empty query"}
    for query, message in refused.items():
        with pytest.raises(ToolError, match=message):
            db.query(query)
    db._conn.set_authorizer(None)  # the last line of defence alone: the file is opened mode=ro
    with pytest.raises(sqlite3.OperationalError, match="readonly"):
        db._conn.execute("INSERT INTO items (name) VALUES ('x')")
    db.close()
    assert hashlib.sha256(database.read_bytes()).hexdigest() == before
    assert not (tmp_path / "other.db").exists()
    with pytest.raises(FileNotFoundError):
        ReadOnlySQL(tmp_path / "missing.db")


def test_sql_timeout_stops_a_slow_query(database):
    db = ReadOnlySQL(database, timeout_s=0.3)
    slow = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 1000000000) SELECT count(*) FROM c"
    start = time.monotonic()
    with pytest.raises(ToolTimeout, match="^timeout: the query ran past 0.3 s"):
        db.query(slow)
    assert time.monotonic() - start < 2
    assert db.query("SELECT count(*) FROM items") == "count(*)\n120"  # the connection still works


def test_sql_concurrent_use(database):
    shared, errors = ReadOnlySQL(database), []

    def work(worker: int) -> None:
        own = ReadOnlySQL(database)
        for i in range(20):
            for db in (shared, own):
                target = 1 + (worker * 20 + i) % 120
                if db.query(f"SELECT name FROM items WHERE id = {target}") != f"name\nitem{target}":
                    errors.append((worker, i))

    threads = [threading.Thread(target=work, args=(w,)) for w in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []


def test_importing_the_tools_loads_no_ml_library():
    code = ("import sys, lmpo.envs.tools, lmpo.envs.parsing; "
            "print([m for m in ('torch', 'transformers', 'numpy', 'lmpo.models', 'lmpo.rollout') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_clip_never_lengthens_what_it_clips():
    """`clip` replaced 2 characters with an 18-character marker ('…[clipped 2 chars]')."""
    from lmpo.envs.tools.schema import clip

    assert clip("x" * 30, 28) == "x" * 30
    assert clip("x" * 100, 28) == "x" * 28 + "…[clipped 72 chars]"
