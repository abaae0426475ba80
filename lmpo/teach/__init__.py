"""Teaching and self-checking: `lmpo explain`, `lmpo compare`, `lmpo factcheck`, `lmpo exercise`.

Everything printed here is computed by the library's own functions (`lmpo.algos`, the trainers),
never typed by hand."""
