#!/usr/bin/env bash
# Installs into .venv if needed, then runs the full CPT → SFT → GRPO pipeline on the
# embedded task and model. Extra arguments go to `lmpo pipeline` (e.g. --seed 1 --out DIR).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-venv.sh
exec .venv/bin/lmpo pipeline "$@"
