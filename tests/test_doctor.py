"""``avatar-render doctor`` as printed: every hint readable as written, nothing marked ok that is missing."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

import avatar_render.doctor as doctor
from avatar_render.cli import app


def rows(monkeypatch, missing: set[str]) -> dict[str, tuple[str, str]]:
    """doctor's table as {item: (ok, detail)}, with the distributions in ``missing`` reported as not installed."""
    real = doctor._version
    monkeypatch.setattr(doctor, "_version", lambda dist: None if dist in missing else real(dist))
    result = CliRunner().invoke(app, ["doctor"], env={"COLUMNS": "400"})  # wide: one table line per row
    assert result.exit_code == 0, result.stderr
    table = {}
    for line in result.stdout.splitlines():
        cells = [c.strip() for c in line.strip("│ ").split("│")]
        if len(cells) == 4 and cells[1] and cells[2] in ("yes", "no"):
            table[cells[1]] = (cells[2], cells[3])
    return table


def test_a_missing_torch_is_not_ok_and_the_hint_names_the_model_extra(monkeypatch):
    table = rows(monkeypatch, {"torch", "diffusers"})
    assert table["torch"][0] == "no" and "not installed" in table["torch"][1]
    ok, hint = table["infinitetalk"]
    assert ok == "no" and "needs torch, diffusers" in hint
    assert "pip install -e '.[model]'" in hint  # the brackets survive the table's markup


@pytest.mark.parametrize("missing", [set(), {"torch"}])
def test_every_hint_is_printed_as_written(monkeypatch, missing):
    printed = rows(monkeypatch, missing)
    real = doctor._version
    monkeypatch.setattr(doctor, "_version", lambda dist: None if dist in missing else real(dist))
    checks = {c.name: c for c in doctor.diagnose()}
    assert set(printed) == set(checks)
    for name, (ok, detail) in printed.items():
        assert (ok, detail) == ("yes" if checks[name].ok else "no", checks[name].detail)


def test_a_version_outside_the_pins_is_not_ok_and_the_hint_names_the_pin(monkeypatch):
    real = doctor._version
    monkeypatch.setattr(doctor, "_version", lambda dist: "5.0.0" if dist == "opencv-python-headless" else real(dist))
    checks = {c.name: c for c in doctor.diagnose()}
    assert not checks["opencv-python-headless"].ok
    assert checks["opencv-python-headless"].detail == ("5.0.0, outside what avatar-render is tested with: "
                                                       "pip install 'opencv-python-headless<5,>=4.8'")
    assert checks["numpy"].ok and checks["av"].ok  # the installed ones are within their pins


def test_opencv_without_the_hog_descriptor_gets_one_sentence(monkeypatch):
    import cv2
    import numpy as np

    from avatar_render.errors import AvatarRenderError
    from avatar_render.face import identity

    identity._hog.cache_clear()
    monkeypatch.delattr(cv2, "HOGDescriptor")
    try:
        with pytest.raises(AvatarRenderError, match=r"lacks: pip install 'opencv-python-headless>=4.8,<5'\.$"):
            identity.face_descriptor(np.zeros((120, 120), np.float32))
    finally:
        identity._hog.cache_clear()
