#!/usr/bin/env bash
# Installs into .venv if needed, then runs the test suite (the slow end-to-end checks are
# excluded; run them with: scripts/test.sh -m slow). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-venv.sh
exec .venv/bin/python -m pytest -q "$@"
