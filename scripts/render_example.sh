#!/usr/bin/env bash
# Install avatar-render into .venv (CPU only) and render the example to out.mp4.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/_venv.sh
python -m pip install -q -e .
# The face landmark model (from the mediapipe 0.10.21 wheel on PyPI); without it the preview uses a template mesh.
python scripts/fetch_face_model.py || echo "warning: no face landmark model; the preview uses its template mesh" >&2
avatar-render render --ref examples/face.png --audio examples/talk.wav -o out.mp4 --force "$@"
