"""Search over a local corpus: a BM25 index (bm25s) and the `search` / `open` tools an agent
uses to find a document and read it."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

from lmpo.envs.tools.schema import Tool, ToolError, clip, tool

_FIELDS = ("id", "title", "text")


class SearchIndex:
    """BM25 over documents ``{"id", "title", "text"}`` (title and text are indexed together),
    lower-cased by bm25s' tokenizer, English stopwords removed, no stemming."""

    def __init__(self, documents: Sequence[Mapping[str, str]]):
        # imported here so that importing lmpo.envs.tools (reward workers) does not load numpy
        import bm25s
        from bm25s.tokenization import Tokenizer

        if not documents:
            raise ValueError("SearchIndex needs at least one document")
        self._docs: dict[str, tuple[str, str]] = {}
        for i, doc in enumerate(documents):
            problem = _document_problem(doc)
            if problem:
                raise ValueError(f"document {i}: {problem}")
            if doc["id"] in self._docs:
                raise ValueError(f"document {i}: duplicate id {doc['id']!r}")
            self._docs[doc["id"]] = (doc["title"], doc["text"])
        self._ids = list(self._docs)
        self._tokenizer = Tokenizer(lower=True, stopwords="en", stemmer=None)
        corpus = self._tokenizer.tokenize([f"{title}\n{text}" for title, text in self._docs.values()],
                                          update_vocab=True, return_as="tuple", show_progress=False)
        self._bm25 = bm25s.BM25()
        self._bm25.index(corpus, show_progress=False)

    @classmethod
    def from_jsonl(cls, path: str | Path) -> SearchIndex:
        """One JSON object per line with string fields id, title, text; blank lines are skipped.
        A malformed row raises ValueError naming the file, the line and the field."""
        documents = []
        with open(path, encoding="utf-8") as file:
            for number, line in enumerate(file, start=1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as error:
                    raise ValueError(f"{path}:{number}: invalid JSON: {error}") from None
                problem = _document_problem(row)
                if problem:
                    raise ValueError(f"{path}:{number}: {problem}")
                documents.append(row)
        if not documents:
            raise ValueError(f"{path}: no documents")
        try:
            return cls(documents)
        except ValueError as error:
            raise ValueError(f"{path}: {error}") from None

    def __len__(self) -> int:
        return len(self._ids)

    def search(self, query: str, k: int = 3) -> list[tuple[str, str, float]]:
        """The `k` best documents for `query` as (id, title, score), best first; only documents
        sharing a term with the query (score > 0). An empty query raises ToolError."""
        if not query.strip():
            raise ToolError("empty query: write the words to search for")
        if k < 1:
            raise ValueError(f"k must be positive, got {k}")
        # update_vocab=False: the vocabulary is not mutated, so concurrent searches are safe
        token_ids = self._tokenizer.tokenize([query], update_vocab=False, return_as="ids", show_progress=False,
                                             allow_empty=False)
        if not token_ids[0]:  # no query word is in the corpus (bm25s would fall back to its empty token)
            return []
        indices, scores = self._bm25.retrieve(token_ids, k=min(k, len(self._ids)), show_progress=False)
        return [(self._ids[int(index)], self._docs[self._ids[int(index)]][0], float(score))
                for index, score in zip(indices[0], scores[0]) if score > 0]

    def open(self, doc_id: str) -> str:
        """The document's title, a newline and its text; an unknown id raises ToolError."""
        if doc_id not in self._docs:
            raise ToolError(f"unknown document id {clip(doc_id, 80)!r}: use an id from the search results")
        title, text = self._docs[doc_id]
        return f"{title}\n{text}"


def _document_problem(row: object) -> str | None:
    if not isinstance(row, Mapping):
        return f"expected a JSON object with fields {', '.join(_FIELDS)}, got {type(row).__name__}"
    for field in _FIELDS:
        if field not in row:
            return f"missing field {field!r}"
        if not isinstance(row[field], str):
            return f"field {field!r} must be a string, got {type(row[field]).__name__}"
    if not row["id"]:
        return "field 'id' must not be empty"
    return None


def make_search_tools(index: SearchIndex, max_chars: int = 1000, *, k: int = 3) -> list[Tool]:
    """Two tools: `search` (numbered ``id: title`` lines of the `k` best documents) and `open`
    (a document's title and text, clipped to `max_chars` with a visible marker)."""

    def search(query: str) -> str:
        """Search the document collection and list the best matches as id: title.

        Args:
            query: Words to look for.
        """
        hits = index.search(query, k=k)
        if not hits:
            return f"no results for {clip(query, 80)!r}"
        return clip("\n".join(f"{rank}. {doc_id}: {title}" for rank, (doc_id, title, _) in enumerate(hits, 1)),
                    max_chars)

    def open_document(doc_id: str) -> str:
        """Open a document by its id and return its title and text.

        Args:
            doc_id: A document id from the search results.
        """
        return clip(index.open(doc_id), max_chars)

    return [tool(search), tool(open_document, name="open")]
