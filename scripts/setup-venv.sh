#!/usr/bin/env bash
# Creates .venv in the repository and installs lmpo (editable) with what it needs.
# PyTorch: the CPU build where no NVIDIA GPU is visible, so a CPU machine never downloads a
# multi-GB CUDA build. Set LMPO_TORCH_INDEX to a PyTorch wheel index URL to choose where
# torch comes from (e.g. PyTorch's CPU-only index on a machine whose pip has no CPU wheel).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
TORCH_VERSION=${LMPO_TORCH_VERSION:-2.13.0}

# one set-up at a time: the README's two commands started together would otherwise install into
# the same .venv at once and break each other's install; the second waits, then finds it done
mkdir -p .venv
exec 9> .venv/.setup.lock
if command -v flock >/dev/null 2>&1; then flock 9; fi
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
PIP=(.venv/bin/python -m pip --disable-pip-version-check -q)

if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  echo "setup: installing PyTorch into .venv (log: .venv/install-torch.log)" >&2
  index=()
  if [ -n "${LMPO_TORCH_INDEX:-}" ]; then index=(--index-url "$LMPO_TORCH_INDEX"); fi
  torch_spec="torch==${TORCH_VERSION}"
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    torch_spec=torch
  fi
  if ! "${PIP[@]}" install "${index[@]}" "$torch_spec" > .venv/install-torch.log 2>&1; then
    tail -n 30 .venv/install-torch.log >&2
    echo "setup: installing $torch_spec failed; the full log is in .venv/install-torch.log" >&2
    exit 1
  fi
fi

stamp=.venv/.lmpo-installed
want=$(cat pyproject.toml | sha256sum | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "setup: installing lmpo and its dependencies into .venv (log: .venv/install.log)" >&2
  if ! "${PIP[@]}" install -e ".[test]" > .venv/install.log 2>&1; then
    tail -n 30 .venv/install.log >&2
    echo "setup: pip install failed; the full log is in .venv/install.log" >&2
    exit 1
  fi
  echo "$want" > "$stamp"
fi
[ -f .venv/.lmpo-sandbox-checked ] || { bash scripts/install-sandbox.sh >> .venv/install-sandbox.log 2>&1; touch .venv/.lmpo-sandbox-checked; } || true
