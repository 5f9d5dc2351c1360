#!/usr/bin/env bash
# Install avatar-render into .venv (CPU only) and render the example to out.mp4.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/_venv.sh
python -m pip install -q -e .
avatar-render render --ref examples/face.png --audio examples/talk.wav -o out.mp4 --force "$@"
