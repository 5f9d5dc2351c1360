# Sourced by scripts/test.sh: install PyTorch if it is missing. Without an NVIDIA GPU take the CPU
# build (a few hundred MB) rather than PyPI's default CUDA build (several GB).
if ! python -c "import torch" >/dev/null 2>&1; then
  if command -v nvidia-smi >/dev/null 2>&1; then
    python -m pip install -q "torch>=2.4"
  else
    python -m pip install -q "torch==2.13.0+cpu" 2>/dev/null \
      || python -m pip install -q "torch==2.13.0" --index-url https://download.pytorch.org/whl/cpu
  fi
fi
