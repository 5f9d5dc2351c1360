from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def face_png() -> Path:
    return ROOT / "examples" / "face.png"


@pytest.fixture(autouse=True, scope="session")
def _one_torch_thread():
    """Two OpenMP threads on a busy 2-core machine spin against each other and the writer thread."""
    try:
        import torch
    except ImportError:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
