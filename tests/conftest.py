from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def face_png() -> Path:
    return ROOT / "examples" / "face.png"
