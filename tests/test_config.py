from fractions import Fraction
from pathlib import Path

import pytest

from avatar_render.config import load_config
from avatar_render.errors import AvatarRenderError

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def test_preview_yaml_spells_out_the_defaults():
    assert load_config(CONFIGS / "preview.yaml") == load_config()


@pytest.mark.parametrize("name", ["tiny", "infinitetalk-480p", "infinitetalk-720p", "flashtalk"])
def test_shipped_configs_load(name):
    assert load_config(CONFIGS / f"{name}.yaml").backend == "infinitetalk"


@pytest.mark.parametrize("override,key", [("preview.fpx=1", "preview.fpx"), ("video.width=abc", "video.width"),
                                          ("chunk.chunk_frames=0", "chunk.chunk_frames"),
                                          ("model.sr=latent2x", "model.sr")])
def test_bad_keys_are_named(override, key):
    with pytest.raises(AvatarRenderError, match=key.replace(".", r"\.")):
        load_config(None, (override,))


def test_ntsc_rate_is_exact():
    assert str(load_config(None, ("preview.fps=29.97",)).fps) == "30000/1001"
    # as FFmpeg writes rates (it was refused: "could not be converted to Float")
    for rate in ("30000/1001", "24000/1001", "60000/1001", "25/1"):
        assert load_config(None, (f"preview.fps={rate}",)).fps == Fraction(rate)
    assert load_config(None, ("model.fps=25/1",)).model.fps == 25.0
    with pytest.raises(AvatarRenderError, match="divides by zero"):
        load_config(None, ("preview.fps=30/0",))


def test_moved_face_box_key_still_works_with_a_warning():
    from avatar_render.config import ConfigWarning

    with pytest.warns(ConfigWarning, match="face.box"):
        cfg = load_config(None, ("preview.face_box=[10,20,30,40]",))
    assert cfg.face.box == [10, 20, 30, 40] and cfg.preview.face_box is None
    assert load_config(None, ("face.box=[10,20,30,40]",)) == cfg
