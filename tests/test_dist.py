"""One request across several processes: real ``torchrun`` launches with gloo on the CPU, tiny model.

Tolerances: renders are compared through the per-chunk SHA-256 of the raw RGB frames (exact) when no
sequence parallelism is used; with it, through the decoded MP4 frames, at most 2 levels of 255 apart,
and the DiT's output at most 1e-5 apart (float32 rounding of differently batched matmuls).
"""

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import av
import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from avatar_render.config import load_config
from avatar_render.distributed.device_mesh import Launch, pick_device, resolve_device
from avatar_render.distributed.launch import session
from avatar_render.errors import AvatarRenderError
from avatar_render.infinitetalk.components import architectures
from tests.media import speech_like, write_audio
from tests.test_infinitetalk import model_folder  # noqa: F401 - the tiny model folder, a fixture

ROOT = Path(__file__).resolve().parents[1]
TORCHRUN = shutil.which("torchrun") or str(Path(sys.executable).with_name("torchrun"))
pytestmark = [pytest.mark.slow, pytest.mark.skipif(not Path(TORCHRUN).exists(), reason="torchrun is not installed")]


def env(**extra) -> dict:
    e = {k: v for k, v in os.environ.items()
         if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    return {**e, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), **extra}


def torchrun(n: int, args: list[str], *, timeout: float = 90, **extra) -> subprocess.CompletedProcess:
    cmd = [TORCHRUN, "--standalone", "--nproc-per-node", str(n), f"--log-dir={os.devnull}", *args]
    return subprocess.run(cmd, cwd=ROOT, env=env(**extra), capture_output=True, text=True, timeout=timeout)


def render_args(tmp: Path, audio: Path, name: str, *overrides: str) -> list[str]:
    return ["-m", "avatar_render", "render", "--ref", str(ROOT / "examples" / "face.png"), "--audio", str(audio),
            "-o", str(tmp / f"{name}.mp4"), "-c", str(ROOT / "configs" / "tiny.yaml"), "--report",
            str(tmp / f"{name}.json"),
            "video.crf=0", *overrides]


def hashes(report: Path) -> list[str]:
    return [c["video_sha256"] for c in json.loads(report.read_text())["chunks"]]


def decoded(path: Path) -> np.ndarray:
    with av.open(str(path)) as c:
        return np.stack([f.to_ndarray(format="rgb24") for f in c.decode(video=0)]).astype(np.int16)


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    """The single-process render every launch is compared with."""
    tmp = tmp_path_factory.mktemp("single")
    audio = write_audio(tmp / "s.wav", speech_like(1.5, 16000), 16000)
    args = render_args(tmp, audio, "one")
    done = subprocess.run([sys.executable, *args], cwd=ROOT, env=env(), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return audio, tmp / "one.mp4", tmp / "one.json"


def test_two_processes_render_the_single_process_frames_and_write_once(single, tmp_path):
    audio, mp4, report = single
    done = torchrun(2, render_args(tmp_path, audio, "two"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert hashes(tmp_path / "two.json") == hashes(report)
    written = sorted(p.name for p in tmp_path.iterdir())
    assert written == ["two.json", "two.mp4"]  # one file, one report, no partial file or journal left
    assert done.stdout.count("Wrote ") == 1  # the summary comes from process 0 alone
    assert done.stdout.count("CPU affinity left as it is: the models run on the CPU (gloo).") == 1


def test_four_processes_with_sequence_parallel_match_within_tolerance(single, tmp_path):
    audio, mp4, _ = single
    done = torchrun(4, render_args(tmp_path, audio, "four", "dist.sp=2"))
    assert done.returncode == 0, done.stderr[-3000:]
    a, b = decoded(mp4), decoded(tmp_path / "four.mp4")
    assert a.shape == b.shape
    assert np.abs(a - b).max() <= 2
    assert [p.suffix for p in tmp_path.iterdir()].count(".mp4") == 1


# The CLI with the diffusion backend's model set-up failing on process 1 (argv[1:] are the CLI's arguments).
FAIL_ON_ONE = textwrap.dedent('''
    import os, sys
    from avatar_render.errors import AvatarRenderError
    from avatar_render.infinitetalk import engine
    real = engine.make_components
    def make_components(*args, **kw):
        if os.environ["RANK"] == "1":
            raise AvatarRenderError("Injected failure for testing")
        return real(*args, **kw)
    engine.make_components = make_components
    from avatar_render.cli import main
    sys.argv = ["avatar-render", *sys.argv[1:]]
    main()
''')


def test_error_on_one_process_ends_all_with_one_message(single, tmp_path):
    audio, _, _ = single
    script = tmp_path / "fail_on_one.py"
    script.write_text(FAIL_ON_ONE)
    done = torchrun(2, [str(script), *render_args(tmp_path, audio, "bad")[2:]], timeout=60)  # a hang times out
    assert done.returncode != 0
    out = done.stdout + done.stderr
    assert out.count("Injected failure for testing") == 1
    assert "process 1 of 2" in out
    assert "Traceback" not in out.split("Injected failure")[0]  # no worker traceback before the message
    assert not list(tmp_path.glob("*.mp4"))


WORKER = textwrap.dedent('''
    import json, sys, torch
    from avatar_render.distributed.cfg_parallel import split_passes
    from avatar_render.models.sampler import serial
    from avatar_render.distributed.launch import session
    from avatar_render.distributed.parallelize import local_numel, shard
    from avatar_render.distributed.sequence_parallel import UlyssesOp, apply_sequence_parallel
    from avatar_render.infinitetalk.components import architectures
    from avatar_render.models.dit import build_dit, materialize_random

    out, sp, offload = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
    with session(sp=sp) as mesh:
        c = architectures("tiny").dit
        g = torch.Generator().manual_seed(1)
        f, h, w = 3, 2, 6  # 9 tokens: not a multiple of sp, so the padding path runs
        x = torch.randn(1, c.in_dim, f, h, w, generator=g)
        args = (x, torch.tensor([700.0]), torch.randn(1, 5, c.text_dim, generator=g),
                torch.randn(1, 7, c.clip_dim, generator=g),
                torch.randn(1, c.video_frames(f), c.audio_window, c.audio_layers, c.audio_dim, generator=g))
        with torch.no_grad():
            want = materialize_random(build_dit(c), seed=0)(*args)
            model = materialize_random(build_dit(c), seed=0)
            if sp > 1:
                apply_sequence_parallel(model, model.sp_plan, mesh.group("sp"), heads=c.num_heads)
            shard(model, list(model.blocks), mesh, offload=offload)
            got = model(*args)
            again = model(*args)
            # CFG parallelism: a step's three passes (told apart here by their timestep) over the 2 replicas
            names, ts, ran = ("cond", "no_text", "uncond"), {"cond": 700.0, "no_text": 500.0, "uncond": 300.0}, []
            def run(name, net):
                ran.append(name)
                return net(args[0], torch.tensor([ts[name]]), *args[2:])[0]
            single = materialize_random(build_dit(c), seed=0)
            want_passes = {n: run(n, single) for n in names}
            ran.clear()
            got_passes = split_passes(mesh, serial)(names, lambda n: run(n, model))
        mine, total = local_numel(model)
        json.dump({"mine": mine, "total": total, "diff": (got - want).abs().max().item(),
                   "repeat": (again - got).abs().max().item(),
                   "ulysses": isinstance(model.blocks[0].self_attn.op, UlyssesOp),
                   "sp": mesh.size("sp"), "fsdp": mesh.size("fsdp"), "rep": mesh.size("rep"), "ran": ran,
                   "cfg_diff": max((got_passes[n] - want_passes[n]).abs().max().item() for n in names)},
                  open(f"{out}.{mesh.rank}", "w"))
''')


def test_sharded_dit_holds_one_nth_and_sequence_and_cfg_parallel_match(tmp_path):
    n, sp, offload = 4, 2, 1  # 2 sequence-parallel groups of 2; FSDP over all 4, shards offloaded to the host
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    done = torchrun(n, [str(script), str(tmp_path / "r"), str(sp), str(offload)])
    assert done.returncode == 0, done.stderr[-3000:]
    results = [json.loads((tmp_path / f"r.{rank}").read_text()) for rank in range(n)]
    total = results[0]["total"]
    assert sum(r["mine"] for r in results) == total
    for r in results:
        assert r["total"] == total and r["fsdp"] == n and r["sp"] == sp and r["ulysses"]
        assert abs(r["mine"] / total - 1 / n) < 0.05 / n  # about 1/N each (uneven rows are padded)
        assert r["diff"] < 1e-5
        assert r["repeat"] == 0.0  # resharded after forward and gathered again: the same result
        assert r["rep"] == n // sp and r["cfg_diff"] < 1e-5  # every pass's flow, as one process computes it
    # replica 0 (processes 0, 1) runs passes 0 and 2, replica 1 runs pass 1 and a spare repeat of pass 0
    assert [r["ran"] for r in results] == [["cond", "uncond"]] * 2 + [["no_text", "cond"]] * 2


def test_single_process_session_is_a_no_op():
    with session(sp=2) as mesh:
        assert not mesh.distributed and mesh.is_writer and mesh.size("sp") == 1 and mesh.world == 1


def test_the_library_entry_imports_without_torch():
    code = ("import sys; sys.modules['torch'] = None; import avatar_render.api, avatar_render.distributed; "
            "from avatar_render.distributed.launch import is_writer_process; assert is_writer_process()")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env(), capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr


def test_the_preview_renders_without_torch(tmp_path):
    """The README's first command installs no PyTorch: the whole preview render must not import it."""
    code = ("import sys; sys.modules['torch'] = None; from avatar_render.cli import main; "
            f"sys.argv = ['avatar-render', 'render', '--ref', {str(ROOT / 'examples' / 'face.png')!r}, '--audio', "
            f"{str(ROOT / 'examples' / 'talk.wav')!r}, '-o', {str(tmp_path / 'o.mp4')!r}, '--quiet', 'video.width=64', "
            "'video.height=64']; main()")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env(), capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "o.mp4").stat().st_size > 0


def test_launch_environment_is_checked():
    assert Launch.from_env({"WORLD_SIZE": "4", "RANK": "3", "LOCAL_RANK": "1"}).world == 4
    with pytest.raises(AvatarRenderError, match="RANK=4"):
        Launch.from_env({"WORLD_SIZE": "4", "RANK": "4"})
    with pytest.raises(AvatarRenderError, match="integers"):
        Launch.from_env({"WORLD_SIZE": "two"})


def test_the_models_device_setting_chooses_the_backend(monkeypatch):
    """model.device=cpu keeps a launch on gloo even where GPUs are visible (NCCL cannot carry CPU
    tensors); model.device=cuda without a GPU is refused."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    monkeypatch.setattr(torch.cuda, "set_device", lambda i: None)
    launch = Launch(rank=3, world=8, local_rank=3)
    assert pick_device(launch, "cpu") == (torch.device("cpu"), "gloo")
    assert pick_device(launch, "auto") == (torch.device("cuda", 3), "nccl")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert pick_device(launch, "auto") == (torch.device("cpu"), "gloo")
    with pytest.raises(AvatarRenderError, match="no CUDA device"):
        pick_device(launch, "cuda")
    # the models' device: the setting read by the same function, the launch's GPU taken for all but the CPU
    assert resolve_device("auto") == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device("auto") == torch.device("cuda")
    assert resolve_device("cuda:1", torch.device("cuda", 3)) == torch.device("cuda", 3)
    assert resolve_device("cpu", torch.device("cuda", 3)) == torch.device("cpu")


def test_dist_config_keys_are_validated():
    assert load_config(None, ("dist.sp=2", "dist.offload.dit=offloaded")).dist.offload == {"dit": "offloaded"}
    with pytest.raises(AvatarRenderError, match="dist.sp"):
        load_config(None, ("dist.sp=0",))
    with pytest.raises(AvatarRenderError, match="dist.offload"):
        load_config(None, ("dist.offload.dit=somewhere",))


@pytest.mark.parametrize("dtype,offload", [("float32", "resident"), ("bfloat16", "resident"), ("float32", "offloaded")])
def test_weights_read_into_shards_render_the_single_process_frames(model_folder, tmp_path, dtype, offload):
    """With a model folder the DiT is sharded on the meta device and each process reads only its
    pieces (LoRA merged piecewise too): the frames equal the single-process render's. bfloat16 mixes
    bf16 weights and float32 islands in one FSDP unit; offloaded keeps the shards on the host."""
    lora = tmp_path / "lora.safetensors"
    g = torch.Generator().manual_seed(5)
    d = architectures("tiny").dit.dim
    save_file({"diffusion_model.blocks.0.self_attn.q.lora_down.weight": torch.randn(2, d, generator=g),
               "diffusion_model.blocks.0.self_attn.q.lora_up.weight": torch.randn(d, 2, generator=g)}, str(lora))
    audio = write_audio(tmp_path / "s.wav", speech_like(1.0, 16000), 16000)
    extra = (f"model.root={model_folder}", f"model.lora={lora}", f"model.dtype={dtype}", "model.steps=2")
    done = subprocess.run([sys.executable, *render_args(tmp_path, audio, "one", *extra)], cwd=ROOT, env=env(),
                          capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stderr[-3000:]
    done = torchrun(2, render_args(tmp_path, audio, "two", *extra, f"dist.offload.dit={offload}"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert hashes(tmp_path / "two.json") == hashes(tmp_path / "one.json")


SHARDED_READ = textwrap.dedent('''
    import json, sys
    import avatar_render.models.checkpoints as ck
    from avatar_render.config import load_config
    from avatar_render.distributed.launch import session
    from avatar_render.distributed.parallelize import local_numel
    from avatar_render.infinitetalk.parallel import dit_plan, text_plan
    from avatar_render.infinitetalk.components import make_components

    seen, read = [], ck.load_into
    def watched(model, sources, **kw):  # what the DiT looks like when its tensors are read
        seen.append(all(ck.is_sharded(p) for p in model.parameters()))
        return read(model, sources, **kw)
    ck.load_into = watched
    cfg = load_config(sys.argv[2], ("model.root=" + sys.argv[3],))
    with session() as mesh:
        comps = make_components(cfg.model, seed=0, parallel=dit_plan(cfg.dist, mesh),
                                text_shard=text_plan(cfg.dist, mesh))
        for m in (comps.dit, comps.text):
            m.load()
            m.prefetch()  # (no-ops once sharded)
            m.offload()
        mine, total = local_numel(comps.dit.net)
        text_mine, text_total = local_numel(comps.text.net)
        json.dump({"sharded_when_read": seen, "mine": mine, "total": total, "text": text_mine / text_total,
                   "placements": [comps.dit.placement.value, comps.text.placement.value]},
                  open(f"{sys.argv[1]}.{mesh.rank}", "w"))
''')


def test_each_process_reads_into_its_shards_only_and_the_text_encoder_is_sharded(model_folder, tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(SHARDED_READ)
    done = torchrun(2, [str(script), str(tmp_path / "r"), str(ROOT / "configs" / "tiny.yaml"), str(model_folder)])
    assert done.returncode == 0, done.stderr[-3000:]
    for rank in range(2):
        r = json.loads((tmp_path / f"r.{rank}").read_text())
        assert r["sharded_when_read"] == [True]  # sharded before any tensor was read
        assert abs(r["mine"] / r["total"] - 0.5) < 0.05
        assert abs(r["text"] - 0.5) < 0.05  # the text encoder is sharded too (read whole, then split)
        assert r["placements"] == ["sharded", "sharded"]


# Runs the CLI with the decode stage of process 0 failing at its argv[1]-th call.
FAIL_AT = textwrap.dedent('''
    import os, sys
    from avatar_render.errors import AvatarRenderError
    from avatar_render.infinitetalk import stages
    at, calls, original = int(sys.argv[1]), [0], stages.LatentDecode.run
    def run(self, x, *, static, carry):
        calls[0] += 1
        if calls[0] == at and os.environ.get("RANK") == "0":
            raise AvatarRenderError("Injected failure for testing")
        return original(self, x, static=static, carry=carry)
    stages.LatentDecode.run = run
    from avatar_render.cli import main
    sys.argv = ["avatar-render", *sys.argv[2:]]
    main()
''')


def test_a_failed_launch_resumes_under_torchrun(tmp_path):
    """At 256 px the decode is really split in two strips: on resume each process rebuilds its own
    strip's decoder cache; the result is the uninterrupted launch's, frame for frame."""
    audio = write_audio(tmp_path / "s.wav", speech_like(3.0, 16000, seed=4), 16000)
    tall = ("video.height=256", "model.steps=1")
    done = torchrun(2, render_args(tmp_path, audio, "one", *tall))
    assert done.returncode == 0, done.stderr[-3000:]
    script = tmp_path / "fail.py"
    script.write_text(FAIL_AT)
    args = render_args(tmp_path, audio, "two", *tall)[2:]  # without "-m avatar_render"
    failed = torchrun(2, [str(script), "6", *args])
    assert failed.returncode != 0 and "--resume to continue from frame" in failed.stderr, failed.stderr[-3000:]
    resumed = torchrun(2, render_args(tmp_path, audio, "two", *tall, "--resume"))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "Resuming" in resumed.stdout
    assert hashes(tmp_path / "two.json") == hashes(tmp_path / "one.json")
    assert (tmp_path / "two.mp4").read_bytes() == (tmp_path / "one.mp4").read_bytes()  # the very bytes


# The CLI whose writing process dies (SIGKILL) right after the finished file is linked into place, before
# the journal's copy is removed (argv[1:] are the CLI's arguments).
KILL_IN_MOVE = textwrap.dedent('''
    import os, signal, sys
    from avatar_render.job import loop
    def move(src, dst, **kw):
        os.link(src, dst)
        os.kill(os.getpid(), signal.SIGKILL)
    loop.move_into_place = move
    from avatar_render.cli import main
    sys.argv = ["avatar-render", *sys.argv[1:]]
    main()
''')


def test_a_launch_killed_while_moving_its_output_into_place_is_finished_by_resume(single, tmp_path):
    """Process 0 finds the render finished and tidies up; the others hear so and run no chunk loop."""
    audio, mp4, _ = single
    script = tmp_path / "kill_in_move.py"
    script.write_text(KILL_IN_MOVE)
    killed = torchrun(2, [str(script), *render_args(tmp_path, audio, "two")[2:]])
    assert killed.returncode != 0 and (tmp_path / "two.mp4").exists() and (tmp_path / "two.mp4.journal").is_dir()
    resumed = torchrun(2, render_args(tmp_path, audio, "two", "--resume"))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "was complete" in resumed.stdout
    assert (tmp_path / "two.mp4").read_bytes() == mp4.read_bytes()
    assert not (tmp_path / "two.mp4.journal").exists() and not (tmp_path / "two.partial.mp4").exists()


@pytest.mark.parametrize("n,height,guard", [(2, 256, 0.0), (3, 16, 0.0), (3, 64, 0.7)])
def test_split_decode_matches_the_single_process_frames(tmp_path, n, height, guard):
    """Each process decodes a strip of rows: at 256 px (32 latent rows, 16 a process) the strips are
    really cut; at 16 px (2 latent rows for 3 processes) one strip is empty; with the colour guard the
    strips' statistics are added up across the processes. Within float32 rounding of the decode: at
    most 2 levels of 255 in the MP4 (crf 0)."""
    audio = write_audio(tmp_path / "s.wav", speech_like(1.0, 16000), 16000)
    size = (f"video.height={height}", "model.steps=1", f"model.colour_guard={guard}")
    done = subprocess.run([sys.executable, *render_args(tmp_path, audio, "one", *size)], cwd=ROOT, env=env(),
                          capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stderr[-3000:]
    done = torchrun(n, render_args(tmp_path, audio, "many", *size, "dist.cfg_parallel=false"))
    assert done.returncode == 0, done.stderr[-3000:]
    one, many = decoded(tmp_path / "one.mp4"), decoded(tmp_path / "many.mp4")
    assert one.shape == many.shape and one.shape[1] == height
    assert np.abs(one - many).max() <= 2
