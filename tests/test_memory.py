"""Frame buffers alive at once in a whole render, counted: peak memory set by the chunk sizes, not by
the order in which threads happened to let go of earlier chunks."""

import weakref

import pytest

from avatar_render.api import RenderRequest, render
from avatar_render.config import load_config
from avatar_render.preview import engine
from tests.media import speech_like, write_audio


@pytest.mark.parametrize("overrides", [(), ("chunk.transition_frames=0",)], ids=["n-i-schedule", "n-only"])
def test_a_render_holds_one_published_segment_while_it_decodes_the_next(tmp_path, face_png, monkeypatch, overrides):
    """When the decode of a segment starts, at most the segment before it is still alive (the writer
    encodes it); the drain at the end and the hashing of each chunk for the journal hold no more."""
    alive: dict[int, weakref.ref] = {}  # segment's start frame -> its frames
    seen: list[tuple[int, list[int]]] = []  # (segment's start, earlier segments alive when its decode began)
    run = engine.PreviewRender.run

    def counted(self, x, **kw):
        seen.append((x.start, sorted(s for s, ref in alive.items() if ref() is not None)))
        out, carry = run(self, x, **kw)
        alive[x.start] = weakref.ref(out.frames)
        return out, carry

    monkeypatch.setattr(engine.PreviewRender, "run", counted)
    audio = write_audio(tmp_path / "in.wav", speech_like(9.0, 16000), 16000)
    cfg = load_config(None, ("video.width=128", "video.height=128", *overrides))
    report = render(RenderRequest(reference=face_png, audio=audio, output=tmp_path / "out.mp4", config=cfg))
    assert report.frames == 225 and len(seen) >= 5
    for i, (start, earlier) in enumerate(seen):
        assert earlier in ([], [seen[i - 1][0]] if i else []), f"decoding from frame {start}: {earlier} alive"
    assert all(ref() is None for ref in alive.values()), "frames kept after the render"
