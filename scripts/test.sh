#!/usr/bin/env bash
# Install avatar-render with its test dependencies into .venv (CPU only) and run the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/_venv.sh
python -m pip install -q -e ".[test]"
python -m pytest "$@"
