"""Frame buffers alive at once in a whole render, counted: peak memory set by the chunk sizes, not by
the order in which threads happened to let go of earlier chunks."""

import weakref

import pytest

from avatar_render.api import RenderRequest, render
from avatar_render.config import load_config
from avatar_render.preview import engine
from tests.media import speech_like, write_audio


@pytest.mark.parametrize("overrides", [(), ("chunk.transition_frames=0",)], ids=["n-i-schedule", "n-only"])
def test_a_render_holds_one_chunk_of_published_frames_while_it_draws_more(tmp_path, face_png, monkeypatch, overrides):
    """When a decode call starts (a segment, or a piece of one: ``Pipeline.decode_piece_frames``), what is
    still alive of the frames drawn before is the last few pieces, a chunk's frames at most (the writer's
    queue of one chunk: ``run.queue_chunks``); the drain at the end and the hashing of each chunk for the
    journal hold no more."""
    alive: dict[int, weakref.ref] = {}  # a call's first frame -> its frames
    sizes: dict[int, int] = {}  # a call's first frame -> its frame count
    seen: list[tuple[int, list[int]]] = []  # (a call's first frame, earlier calls' frames alive when it began)
    run = engine.PreviewRender.run

    def counted(self, x, **kw):
        seen.append((x.start, sorted(s for s, ref in alive.items() if ref() is not None)))
        out, carry = run(self, x, **kw)
        alive[x.start], sizes[x.start] = weakref.ref(out.frames), len(out.frames)
        return out, carry

    monkeypatch.setattr(engine.PreviewRender, "run", counted)
    audio = write_audio(tmp_path / "in.wav", speech_like(9.0, 16000), 16000)
    cfg = load_config(None, ("video.width=128", "video.height=128", *overrides))
    report = render(RenderRequest(reference=face_png, audio=audio, output=tmp_path / "out.mp4", config=cfg))
    assert report.frames == 225 and len(seen) >= 5
    pieces = engine.build_preview(cfg).puts_per_chunk()
    assert max(sizes.values()) <= engine.PIECE_FRAMES < cfg.chunk.chunk_frames  # (drawn in pieces)
    for i, (start, earlier) in enumerate(seen):
        last = [s for s, _ in seen[max(0, i - len(earlier)) : i]]
        assert earlier == sorted(last) and len(earlier) <= pieces, f"decoding from frame {start}: {earlier} alive"
        assert sum(sizes[s] for s in earlier) <= cfg.chunk.chunk_frames, f"decoding from frame {start}"
    assert all(ref() is None for ref in alive.values()), "frames kept after the render"
