"""The SR stage in the diffusion backend's pipeline at the tiny size: frames at the output size, an
``sr`` stage in the report, resumable across chunks and I-chunk seams, constant memory, and the face
guard (mouth on the fidelity path, fallback when the face drifts)."""

import json
import math
import weakref
from pathlib import Path

import av
import numpy as np
import pytest
import torch

from avatar_render.api import RenderRequest, render
from avatar_render.config import load_config
from avatar_render.distributed.device_mesh import single
from avatar_render.errors import AvatarRenderError
from avatar_render.infinitetalk.sr import SRStage, to_unit, unit_to_uint8, upscale
from avatar_render.infinitetalk.sr_guard import FaceGuard, GuardSettings, TrackState
from avatar_render.infinitetalk.stage_io import Decoded
from avatar_render.io.audio import AudioReader
from avatar_render.io.reference import load_reference
from avatar_render.job.setup import build_pipeline as build_for
from avatar_render.models.sr.geometry import Cover
from avatar_render.pipeline.chain import StageChain
from avatar_render.pipeline.pipeline import Pipeline
from avatar_render.pipeline.state import Checkpoint, flatten, unflatten
from avatar_render.pipeline.types import Published, RequestInput
from tests.media import speech_like, write_audio
from tests.sr_assets import write_swiftvr, write_vae2x

ROOT = Path(__file__).resolve().parents[1]


def build_pipeline(cfg):
    return build_for(cfg, single())


def sr_config(*overrides):
    return load_config(ROOT / "configs" / "tiny-sr.yaml", ("model.steps=1", *overrides))


def video_info(path: Path) -> tuple[int, int, int]:
    with av.open(str(path)) as c:
        s = c.streams.video[0]
        return sum(1 for _ in c.decode(video=0)), s.width, s.height


@pytest.fixture(scope="module")
def speech(tmp_path_factory) -> Path:
    return write_audio(tmp_path_factory.mktemp("a") / "s.wav", speech_like(1.5, 16000), 16000)


@pytest.mark.parametrize("overrides,stages", [
    ((), {"decode", "sr"}),
    (("model.sr=vae2x",), {"decode", "sr"}),
    (("model.sr_fidelity=vae2x", "chunk.transition_frames=8"), {"decode", "decode2x", "sr"}),
])
@pytest.mark.slow
def test_tiny_sr_render_writes_the_output_size_and_times_an_sr_stage(tmp_path, face_png, speech, overrides, stages):
    out, report = tmp_path / "o.mp4", tmp_path / "r.json"
    rep = render(RenderRequest(reference=face_png, audio=speech, output=out, config=sr_config(*overrides),
                               report=report))
    assert video_info(out) == (math.ceil(1.5 * 25), 128, 128) and (rep.width, rep.height) == (128, 128)
    timed = json.loads(report.read_text())["stage_s"]
    assert stages <= set(timed) and timed["sr"] > 0
    assert all(stages <= set(c["stage_s"]) for c in json.loads(report.read_text())["chunks"])


def test_the_generation_size_and_the_output_size_are_separate_settings():
    assert sr_config().gen_size == (64, 64)
    assert load_config(None, ("backend=infinitetalk", "model.sr=swiftvr", "video.width=1280",
                              "video.height=720")).gen_size == (640, 352)
    assert load_config(None, ("backend=infinitetalk", "model.sr=vae2x", "video.width=1920",
                              "video.height=1080")).gen_size == (960, 528)
    assert load_config(None, ("backend=infinitetalk", "video.width=640", "video.height=352")).gen_size == (640, 352)
    for bad, key in [(("model.gen_width=100", "model.gen_height=64"), "model.gen_width"),
                     (("model.gen_width=0",), "model.gen_width"),
                     (("model.sr=none", "model.gen_width=64", "model.gen_height=64"), "model.gen_width"),
                     (("model.sr=esrgan",), "model.sr"), (("model.sr_mouth=2",), "model.sr_mouth")]:
        with pytest.raises(AvatarRenderError, match=key.replace(".", r"\.")):
            sr_config(*bad)


def test_sr_weights_come_from_local_folders_when_the_model_does(tmp_path):
    (tmp_path / "base").mkdir()
    with pytest.raises(AvatarRenderError, match="set model.sr_root"):
        build_pipeline(sr_config(f"model.root={tmp_path / 'base'}"))
    with pytest.raises(AvatarRenderError, match="model.vae2x '.*nowhere' does not exist"):
        build_pipeline(sr_config("model.sr=vae2x", f"model.vae2x={tmp_path / 'nowhere'}"))


@pytest.mark.slow
def test_sr_stages_read_their_published_folders(tmp_path, face_png, speech):
    write_swiftvr(tmp_path / "SwiftVR")
    write_vae2x(tmp_path / "Wan2.1-VAE-upscale2x", "diffusers")
    cfg = sr_config(f"model.sr_root={tmp_path / 'SwiftVR'}", "model.sr_fidelity=vae2x",
                    f"model.vae2x={tmp_path / 'Wan2.1-VAE-upscale2x'}")
    pipe = build_pipeline(cfg)
    files = {p.name for m in pipe.decode.modules() for p in m.weight_files()}
    assert files == {"reae.safetensors", "prompt_embedding.safetensors", "config.json",
                     "diffusion_pytorch_model.safetensors"}
    rep = render(RenderRequest(reference=face_png, audio=speech, output=tmp_path / "o.mp4", config=cfg))
    assert (rep.frames, rep.width) == (38, 128)


# -- resume and memory ------------------------------------------------------------------------------


def chunk_loop(cfg, pipe, face: Path, audio_path: Path):
    static = pipe.prepare(RequestInput(reference=load_reference(face), reference_path=face, width=cfg.video.width,
                                       height=cfg.video.height, seed=0))

    def run(resume=None):
        with AudioReader(audio_path, fps=cfg.fps, model_rate=pipe.audio_rate) as audio:
            return list(pipe.stream(static, audio, seed=0, resume=resume, checkpoints=True))

    return run


@pytest.mark.slow
def test_sr_loop_resumes_exactly_across_chunks_and_seams(tmp_path, face_png):
    cfg = sr_config("chunk.transition_frames=8")
    run = chunk_loop(cfg, build_pipeline(cfg), face_png,
                     write_audio(tmp_path / "a.wav", speech_like(3.0, 16000, seed=2), 16000))
    full = run()
    checkpoints = [i for i, item in enumerate(full) if isinstance(item, Checkpoint)]
    assert {p.plan.kind for p in full if isinstance(p, Published)} == {"N", "I"}
    for i in (checkpoints[1], checkpoints[-2]):
        decode_carry, sr_carry = full[i].state.decode_carry
        assert sr_carry.model.encoder is None and sr_carry.model.decoder is None  # rebuilt on resume
        rest = run(resume=unflatten(flatten(full[i])))
        want = [p for p in full[i + 1 :] if isinstance(p, Published)]
        got = [p for p in rest if isinstance(p, Published)]
        assert [p.start for p in got] == [p.start for p in want] and got
        assert all(np.array_equal(a.frames, b.frames) for a, b in zip(got, want))


@pytest.mark.slow
def test_long_sr_render_runs_in_constant_memory(tmp_path, face_png, monkeypatch):
    """10 s through the tiny SR backend: what a checkpoint keeps stops growing once the SR's windows
    are full, and a whole render holds no more published frames at once than the chunk before and
    the chunk being handed on, whatever the number of frames rendered."""
    cfg = sr_config()
    run = chunk_loop(cfg, build_pipeline(cfg), face_png,
                     write_audio(tmp_path / "a.wav", speech_like(10.0, 16000, seed=3), 16000))
    sizes, frames = [], 0
    for item in run():
        if isinstance(item, Checkpoint):
            sizes.append(sum(a.nbytes for a in flatten(item.state).arrays.values()))
        else:
            frames += len(item.frames)
    assert frames == 250 and len(sizes) == 16
    # Flat from chunk 9 on, when the VAE decoder's 39-latent window is full (the SR's windows are smaller);
    # the last, shorter chunk leaves at most 3 low-res frames waiting for their group.
    assert len(set(sizes[9:-1])) == 1 and sizes[8] < sizes[9] and sizes[-1] <= sizes[9] + 3 * 64 * 64 * 3

    # Counted, not read from the resident size (which moves by tens of MB between chunks as the
    # allocator takes pages and gives them back): the publications whose frames are still alive each
    # time the render receives the next one.
    alive: list[weakref.ref] = []
    held: list[int] = []
    stream = Pipeline.stream

    def counted(self, *args, **kw):
        for item in stream(self, *args, **kw):
            if isinstance(item, Published):
                held.append(sum(ref() is not None for ref in alive))
                alive.append(weakref.ref(item.frames))
            yield item

    monkeypatch.setattr(Pipeline, "stream", counted)
    rep = render(RenderRequest(reference=face_png, audio=tmp_path / "a.wav", output=tmp_path / "o.mp4",
                               config=cfg))
    assert rep.frames == 250 and len(held) >= 16
    assert max(held) <= 2, held
    assert not any(ref() is not None for ref in alive), "frames kept after the render"


# -- the face guard ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def guarded(face_png):
    """The tiny SR pipeline's static conditioning and its SR stage (no fallback, so the blend shows)."""
    cfg = sr_config("model.sr_identity_drop=2")
    pipe = build_pipeline(cfg)
    static = pipe.prepare(RequestInput(reference=load_reference(face_png), reference_path=face_png, width=128,
                                       height=128, seed=0))
    chain = pipe.decode
    assert isinstance(chain, StageChain)
    return static, chain.stages[-1]


def lowres_clip(static, n: int = 9) -> Decoded:
    """The reference as the low-res frames, moving right a little, with some noise: [1, 3, T, h, w] in [-1, 1]."""
    g = torch.Generator().manual_seed(0)
    ref = torch.from_numpy(static.reference).permute(2, 0, 1).float() / 127.5 - 1
    frames = torch.stack([torch.roll(ref, shifts=i // 3, dims=2) for i in range(n)], dim=1)[None]
    frames = (frames + 0.05 * torch.randn(frames.shape, generator=g)).clamp(-1, 1)
    return Decoded(start=0, end=n, pixels=frames, latents=torch.zeros(16, 3, 8, 8))


def test_the_mouth_region_is_the_fidelity_path_where_the_guard_blends_it(guarded):
    static, stage = guarded
    x = lowres_clip(static)
    out, _ = stage.run(x, static=static, carry=stage.init_carry(static))  # (T, 128, 128, 3) uint8
    lowres = to_unit(x.pixels)
    lowres_u8 = unit_to_uint8(lowres)
    cover = Cover(src=(64, 64), dst=(128, 128))
    fidelity = unit_to_uint8(upscale(lowres_u8.permute(0, 3, 1, 2).float() / 255, cover)).numpy()
    guard = FaceGuard(reference=static.reference, layout=static.layout, cover=cover, settings=stage.guard)
    shifts, _ = guard.track(lowres_u8.numpy(), TrackState())
    assert shifts[-1, 0] > 1  # the face was followed to the right
    mask = guard.mouth_mask(shifts, torch.device("cpu"))[:, 0].numpy()  # (T, H, W)
    inside, outside = mask == 1, mask == 0
    assert inside.sum() > 9 * 50 and outside.sum() > 9 * 10000
    assert np.array_equal(out.frames[inside], fidelity[inside])
    assert np.abs(out.frames[outside].astype(int) - fidelity[outside]).mean() > 5  # elsewhere the SR's own frames


def test_without_the_guard_the_mouth_comes_from_the_sr(guarded):
    static, stage = guarded
    x = lowres_clip(static)
    free = SRStage(size=stage.size, stream=stage.stream, guard=GuardSettings(mouth=0.0, colour=0.0, identity_drop=2.0))
    out, _ = free.run(x, static=static, carry=free.init_carry(static))
    sr, _ = stage.stream.step(unit_to_uint8(to_unit(x.pixels)), stage.stream.start())
    assert np.array_equal(out.frames, unit_to_uint8(sr).numpy())


def test_a_chunk_whose_face_drifts_falls_back_to_the_fidelity_path(guarded):
    static, _ = guarded
    cover = Cover(src=(64, 64), dst=(128, 128))
    lowres = to_unit(lowres_clip(static).pixels)
    lowres_u8 = unit_to_uint8(lowres)
    fidelity = upscale(lowres, cover)
    noise = torch.rand(fidelity.shape, generator=torch.Generator().manual_seed(1))  # no face at all
    for drop, falls in ((0.05, True), (2.0, False)):
        guard = FaceGuard(reference=static.reference, layout=static.layout, cover=cover,
                          settings=GuardSettings(mouth=0.0, colour=0.0, identity_drop=drop))
        shifts, _ = guard.track(lowres_u8.numpy(), TrackState())
        result = guard.apply(noise, fidelity, fidelity, shifts)
        assert result.fell_back is falls and result.similarity < result.fidelity_similarity - 0.1
        assert torch.equal(result.frames, fidelity if falls else noise)


def test_colour_is_matched_to_the_low_res_frame(guarded):
    static, _ = guarded
    cover = Cover(src=(64, 64), dst=(128, 128))
    lowres = to_unit(lowres_clip(static).pixels)
    up = upscale(lowres, cover)
    tinted = (up * 0.6 + torch.tensor([0.3, 0.0, 0.1]).view(1, 3, 1, 1)).clamp(0, 1)  # a colour cast on the SR
    guard = FaceGuard(reference=static.reference, layout=static.layout, cover=cover,
                      settings=GuardSettings(mouth=0.0, colour=1.0, identity_drop=2.0))
    result = guard.apply(tinted, up, up, guard.track(unit_to_uint8(lowres).numpy(), TrackState())[0])
    before = (tinted.mean((2, 3)) - up.mean((2, 3))).abs().max()
    after = (result.frames.mean((2, 3)) - up.mean((2, 3))).abs().max()
    assert before > 0.1 and after < 0.02


def test_doctor_lists_the_sr_files_and_says_which_path_is_unset(tmp_path):
    from avatar_render.doctor import diagnose

    write_swiftvr(tmp_path / "SwiftVR")
    (tmp_path / "base").mkdir()
    checks = diagnose(sr_config(f"model.root={tmp_path / 'base'}", f"model.sr_root={tmp_path / 'SwiftVR'}"))
    rows = {(c.name, c.detail.split(": ", 1)[1]) for c in checks if c.group == "model files"
            and c.name.startswith("sr_")}
    assert rows == {("sr_reae", str(tmp_path / "SwiftVR" / "reae.safetensors")),
                    ("sr_dit", str(tmp_path / "SwiftVR" / "transformer" / "config.json")),
                    ("sr_dit", str(tmp_path / "SwiftVR" / "transformer" / "diffusion_pytorch_model.safetensors")),
                    ("sr_dit", str(tmp_path / "SwiftVR" / "prompt_embedding.safetensors"))}
    assert all(c.ok for c in checks if c.name.startswith("sr_"))
    unset = diagnose(sr_config(f"model.root={tmp_path / 'base'}", "model.sr=vae2x"))
    (row,) = [c for c in unset if c.name == "sr"]
    assert not row.ok and "set model.vae2x" in row.detail


@pytest.mark.slow
def test_sr_dit_streamed_from_host_memory_gives_the_resident_frames(tmp_path, face_png):
    audio = write_audio(tmp_path / "a.wav", speech_like(1.0, 16000, seed=4), 16000)
    frames = {}
    for mode in ("resident", "offloaded"):
        cfg = sr_config(f"dist.offload.sr={mode}")
        pipe = build_pipeline(cfg)
        frames[mode] = [p.frames for p in chunk_loop(cfg, pipe, face_png, audio)() if isinstance(p, Published)]
        dit = pipe.decode.stages[-1].stream.dit
        assert (dit.streamer is not None) == (mode == "offloaded")
    # frame 0 alone (before N0 is sampled), the rest of N0, N1
    assert len(frames["resident"]) == 3 and all(np.array_equal(a, b)
                                                for a, b in zip(frames["resident"], frames["offloaded"]))


@pytest.mark.slow
def test_two_processes_render_the_single_process_sr_frames(tmp_path):
    """Under torchrun (gloo) the SR DiT is sharded (FSDP2) and every process restores the same frames;
    process 0 alone writes them."""
    from tests.test_dist import TORCHRUN, env, hashes, render_args, torchrun

    if not Path(TORCHRUN).exists():
        pytest.skip("torchrun is not installed")
    audio = write_audio(tmp_path / "s.wav", speech_like(1.0, 16000), 16000)
    sr = ("model.steps=1", "model.sr=swiftvr", "video.width=128", "video.height=128", "model.gen_width=64",
          "model.gen_height=64")
    import subprocess
    import sys

    one = subprocess.run([sys.executable, *render_args(tmp_path, audio, "one", *sr)], cwd=ROOT, env=env(),
                         capture_output=True, text=True, timeout=120)
    assert one.returncode == 0, one.stderr[-3000:]
    two = torchrun(2, render_args(tmp_path, audio, "two", *sr), timeout=240)
    assert two.returncode == 0, two.stderr[-3000:]
    assert hashes(tmp_path / "two.json") == hashes(tmp_path / "one.json")
    assert video_info(tmp_path / "two.mp4")[1:] == (128, 128)
    assert "every process decodes whole frames" in two.stdout + two.stderr
