# Sourced by the set-up scripts: create .venv on first use (Python 3.10+) and activate it.
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -c 'import sys; assert sys.version_info >= (3, 10), "avatar-render needs Python 3.10 or newer"'
  "$PY" -m venv .venv
  .venv/bin/python -m pip install -q --upgrade pip
fi
. .venv/bin/activate
