#!/usr/bin/env bash
# Creates .venv-trl in the repository with TRL (pinned) on the CPU build of PyTorch, for the
# tools that run TRL's own code: tests/golden/trl_generate.py (the golden values the parity test
# reads) and comparisons against TRL. lmpo's own environment (.venv) is never touched: TRL pins
# its own transformers/accelerate/datasets, which must not leak into lmpo's.
# PyTorch as scripts/setup-venv.sh pins it (LMPO_TORCH_VERSION, default 2.13.0), always the CPU
# build: nothing here needs a GPU. Where pip's default index would give a CUDA build (PyPI on
# Linux), set LMPO_TORCH_INDEX to PyTorch's CPU wheel index, https://download.pytorch.org/whl/cpu.
# Prints the environment's python on success. Running it again only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
TORCH_VERSION=${LMPO_TORCH_VERSION:-2.13.0}
TRL_VERSION=1.16.0
VENV=.venv-trl

if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)

install() {  # install LOG SPEC...: quiet pip install, the log's tail on failure
  local log=$1; shift
  if ! "${PIP[@]}" install "$@" > "$VENV/$log" 2>&1; then
    tail -n 30 "$VENV/$log" >&2
    echo "setup-trl: installing $* failed; the full log is in $VENV/$log" >&2
    exit 1
  fi
}

if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
  echo "setup-trl: installing PyTorch $TORCH_VERSION (CPU) into $VENV (log: $VENV/install-torch.log)" >&2
  index=()
  if [ -n "${LMPO_TORCH_INDEX:-}" ]; then index=(--index-url "$LMPO_TORCH_INDEX"); fi
  install install-torch.log "${index[@]}" "torch==${TORCH_VERSION}"
fi
if "$VENV/bin/python" -c "import torch, sys; sys.exit(torch.version.cuda is None)" 2>/dev/null; then
  echo "setup-trl: warning: $VENV has a CUDA build of torch; set LMPO_TORCH_INDEX to a CPU wheel index" >&2
fi

if [ "$("$VENV/bin/python" -c "import trl; print(trl.__version__)" 2>/dev/null)" != "$TRL_VERSION" ]; then
  echo "setup-trl: installing trl==$TRL_VERSION into $VENV (log: $VENV/install-trl.log)" >&2
  # the torch above stays: pip keeps an installed version that satisfies TRL's requirement
  install install-trl.log "trl==${TRL_VERSION}" "torch==${TORCH_VERSION}"
fi
"$VENV/bin/python" -c "import torch, trl; assert trl.__version__ == '$TRL_VERSION', trl.__version__"
echo "$VENV/bin/python"
