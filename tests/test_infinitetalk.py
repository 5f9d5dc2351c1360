"""The diffusion backend end to end at the tiny size: random weights, and a model folder in the
published layout read through the real loaders. Same classes as the full-size model."""

import math
from pathlib import Path

import av
import pytest
import torch
from safetensors.torch import save_file

from avatar_render.api import RenderRequest, render
from avatar_render.config import load_config
from avatar_render.errors import AvatarRenderError
from avatar_render.infinitetalk.components import architectures, make_components
from avatar_render.models.dit import build_dit, materialize_random
from tests.media import speech_like, write_audio
from tests.model_assets import write_clip, write_umt5, write_vae, write_wav2vec2
from tests.test_checkpoints import is_audio, write_sharded

TINY = ("-c", "configs/tiny.yaml")
ROOT = Path(__file__).resolve().parents[1]


def tiny_config(*overrides):
    return load_config(ROOT / "configs" / "tiny.yaml", overrides)


def frames_of(path: Path) -> int:
    with av.open(str(path)) as c:
        return sum(1 for _ in c.decode(video=0))


@pytest.fixture(scope="module")
def speech(tmp_path_factory) -> Path:
    return write_audio(tmp_path_factory.mktemp("a") / "s.wav", speech_like(1.5, 16000), 16000)


@pytest.mark.parametrize("transition,mode,chunk,vae", [(0, "latents", 16, "float32"), (8, "latents", 16, "float32"),
                                                     (0, "reencode", 16, "bfloat16"), (0, "latents", 4, "float32")])
@pytest.mark.slow
def test_tiny_random_weights_render(tmp_path, face_png, speech, transition, mode, chunk, vae):
    cfg = tiny_config("model.steps=2", f"chunk.transition_frames={transition}", f"model.context_mode={mode}",
                      f"chunk.chunk_frames={chunk}", f"model.vae_dtype={vae}")
    out = tmp_path / "o.mp4"
    rep = render(RenderRequest(reference=face_png, audio=speech, output=out, config=cfg, report=tmp_path / "r.json"))
    assert rep.frames == frames_of(out) == math.ceil(1.5 * 25)
    import json

    chunks = json.loads((tmp_path / "r.json").read_text())["chunks"]
    kinds = {c["kind"] for c in chunks}
    assert kinds == ({"N", "I"} if transition else {"N"})
    assert [c["start"] for c in chunks] == sorted(c["start"] for c in chunks)


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory) -> Path:
    """The family's download layout: Wan2.1-I2V-14B-480P/ (DiT shards + index, VAE, umT5 + tokenizer,
    CLIP), InfiniteTalk/single/infinitetalk.safetensors and chinese-wav2vec2-base/ beside it."""
    top = tmp_path_factory.mktemp("weights")
    root = top / "Wan2.1-I2V-14B-480P"
    arch = architectures("tiny")
    weights = materialize_random(build_dit(arch.dit), seed=3).state_dict()
    write_sharded(root, {k: v.contiguous() for k, v in weights.items() if not is_audio(k)})
    (top / "InfiniteTalk" / "single").mkdir(parents=True)
    save_file({k: v.contiguous() for k, v in weights.items() if is_audio(k)},
              str(top / "InfiniteTalk" / "single" / "infinitetalk.safetensors"))
    write_vae(root, "wan")
    write_umt5(root, "wan")
    write_clip(root, "wan")
    write_wav2vec2(top / "chinese-wav2vec2-base")
    return root


def test_tiny_model_folder_in_the_published_layout(tmp_path, face_png, speech, model_folder):
    cfg = tiny_config("model.steps=1", f"model.root={model_folder}")
    out = tmp_path / "o.mp4"
    rep = render(RenderRequest(reference=face_png, audio=speech, output=out, config=cfg))
    assert rep.frames == frames_of(out) == math.ceil(1.5 * 25)


def test_missing_and_mismatched_weights_are_one_sentence(tmp_path, face_png, speech, model_folder):
    with pytest.raises(AvatarRenderError, match="not a folder"):
        render(RenderRequest(reference=face_png, audio=speech, output=tmp_path / "a.mp4",
                             config=tiny_config(f"model.root={tmp_path / 'nowhere'}")))
    with pytest.raises(AvatarRenderError, match="does not match this model size|shape"):
        render(RenderRequest(reference=face_png, audio=speech, output=tmp_path / "b.mp4",
                             config=tiny_config(f"model.root={model_folder}", "model.size=14b")))
    assert not (tmp_path / "a.mp4").exists() and not (tmp_path / "b.mp4").exists()


def test_backend_size_rules_are_config_errors(tmp_path, face_png, speech):
    for bad, key in [("chunk.chunk_frames=18", "chunk.chunk_frames"),
                     ("chunk.context_frames=4", "chunk.context_frames"),
                     ("video.width=72", "video.width")]:
        with pytest.raises(AvatarRenderError, match=key.replace(".", r"\.")):
            render(RenderRequest(reference=face_png, audio=speech, output=tmp_path / "c.mp4", config=tiny_config(bad)))


@pytest.mark.parametrize("weights", ["random", "folder"])
def test_every_module_ends_on_its_device(weights, model_folder):
    """Every tensor of every module is on the module's device: random weights as soon as they are
    made, weights read from files once put in place as ``Pipeline.prepare`` does. The meta device
    stands in for a GPU: a tensor left on the CPU shows."""
    root = [f"model.root={model_folder}"] if weights == "folder" else []
    m = tiny_config("model.device=meta", *root).model
    comps = make_components(m, seed=0)
    for module in (comps.vae, comps.text, comps.image, comps.audio) + ((comps.dit,) if weights == "folder" else ()):
        module.load()
        if weights == "folder":
            module.prefetch()
        net = module.net
        where = {t.device.type for t in (*net.parameters(), *net.buffers())}
        assert where == {"meta"}, f"{module.name}: {where}"


def test_encoders_that_run_once_are_freed_after_init_and_load_again(face_png):
    from avatar_render.distributed.device_mesh import single
    from avatar_render.io.reference import load_reference
    from avatar_render.job.setup import build_pipeline
    from avatar_render.pipeline.module import Placement
    from avatar_render.pipeline.types import RequestInput

    pipe = build_pipeline(tiny_config(), single())
    request = RequestInput(reference=load_reference(face_png), reference_path=face_png, width=64, height=64, seed=0)
    first = pipe.prepare(request)
    init = pipe.init
    assert (init.text.placement, init.image.placement) == (Placement.UNLOADED, Placement.UNLOADED)
    assert init.text.net is None and init.image.net is None
    assert init.vae.placement is not Placement.UNLOADED  # the decode stage still needs it
    again = pipe.prepare(request)  # read again (the same seeded weights): the same conditioning
    assert torch.equal(first.text, again.text) and torch.equal(first.clip_fea, again.clip_fea)


def test_colour_guard_moves_each_frame_to_the_reference_statistics_whole_or_in_strips():
    """At full strength every frame takes the reference's per-channel mean and spread; strips whose
    sums are added up (as the processes of a split decode do) give the whole frames' result."""
    from avatar_render.infinitetalk.stages import anchor_colour

    g = torch.Generator().manual_seed(0)
    frames = 0.3 * torch.rand(1, 3, 4, 16, 12, generator=g) - 0.2  # [1, 3, T, H, W], far from clamping
    frames[:, :, 1] += 0.1  # frames differ in colour
    mean, std = torch.tensor([0.1, -0.05, 0.0]), torch.tensor([0.08, 0.1, 0.05])
    full = anchor_colour(frames, mean, std, 1.0)
    flat = full.flatten(3)
    assert torch.allclose(flat.mean(3), mean.view(1, 3, 1).expand(1, 3, 4), atol=1e-5)
    assert torch.allclose(flat.std(3), std.view(1, 3, 1).expand(1, 3, 4), atol=1e-5)
    half = anchor_colour(frames, mean, std, 0.5)
    assert torch.allclose(half, (frames + full) / 2, atol=1e-5)

    rows = [(0, 5), (5, 5), (5, 16)]  # one strip empty, as with more processes than rows
    strips = [frames[..., a:b, :] for a, b in rows]
    sums = []

    def record(s):
        sums.append(s)
        return s

    for part in strips:
        anchor_colour(part, mean, std, 1.0, total=record)
    total = sum(sums)
    parts = [anchor_colour(part, mean, std, 1.0, total=lambda s: total) for part in strips]
    assert torch.allclose(torch.cat(parts, dim=3), full, atol=1e-6)
