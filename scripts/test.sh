#!/usr/bin/env bash
# Install avatar-render with its test and model dependencies into .venv (PyTorch CPU build on a
# machine without a GPU) and run the test suite (the Ray launcher's extra included: EXTRAS=test,model leaves it out).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/_venv.sh
. scripts/_torch.sh
python -m pip install -q -e ".[${EXTRAS:-test,model,ray}]"
python -m pytest "$@"
