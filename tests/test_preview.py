"""The preview backend's parts: phones and visemes, blinks and nods across chunks, the mesh-warp rig."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import cv2
import numpy as np
import pytest

from avatar_render.config import load_config
from avatar_render.face import mesh as fm
from avatar_render.face.landmarks import find_model
from avatar_render.io.audio import AudioReader
from avatar_render.io.reference import load_reference
from avatar_render.job.setup import request_input
from avatar_render.pipeline.schedule import ChunkPlan
from avatar_render.pipeline.types import ChunkInput
from avatar_render.preview import motion
from avatar_render.preview.engine import MotionAnchor, PreviewAnimator, SpeechFeatures, build_preview
from avatar_render.preview.motion import OPEN, PARAMS, MotionCarry, blink_track, emphasis, head_track
from avatar_render.preview.phones import (
    FLOOR_BELOW_PEAK_DB,
    FLOOR_MARGIN_DB,
    GAP_CLOSURE_S,
    GAP_LEAD_S,
    RATE,
    Phone,
    PhoneRecognizer,
    frame_levels,
    lip_closures,
    model_dir,
    quiet_gaps,
    stop_closures,
    with_floor,
)
from avatar_render.preview.render import render_frame
from avatar_render.preview.visemes import mouth_targets

ROOT = Path(__file__).resolve().parents[1]
FACE = ROOT / "examples" / "face.png"
TALK = ROOT / "examples" / "talk.wav"
needs_sphinx = pytest.mark.skipif(model_dir() is None, reason="pocketsphinx is not installed")


def rig_for(width: int, height: int, *extra: str, ref: Path = FACE):
    cfg = load_config(None, (f"video.width={width}", f"video.height={height}", *extra))
    return build_preview(cfg).prepare(request_input(cfg, load_reference(ref), ref))


def row(open_=0.0, width=0.0, blink=0.0, dx=0.0, dy=0.0, roll=0.0, zoom=0.0) -> np.ndarray:
    return np.array([open_, width, blink, dx, dy, roll, zoom], np.float32)


@needs_sphinx
def test_phone_recognition_depends_on_the_window_only():
    with AudioReader(TALK, fps=Fraction(25), model_rate=RATE) as a:
        a.probe(10**6)
        x = a.model_audio(0, a.total_frames)
    windows = [x[s : s + 2 * RATE] for s in range(0, 8 * RATE, 2 * RATE)]
    ahead = PhoneRecognizer()
    forward = [ahead.recognize(w) for w in windows]
    back = PhoneRecognizer()
    backward = [back.recognize(w) for w in reversed(windows)][::-1]
    assert forward == backward  # what a resumed render (fresh decoder, later windows first) sees
    labels = {p.label for ps in forward for p in ps}
    assert len(labels) > 10 and "SIL" in labels


@needs_sphinx
def test_the_c_api_decoder_hears_what_pocketsphinxs_python_binding_hears():
    """The recogniser drives PocketSphinx through its C API (letting other threads run meanwhile): the same
    segments, frame for frame, as the binding's own decoder with the same settings, window after window."""
    from pocketsphinx import Decoder

    from avatar_render.preview import phones

    with AudioReader(TALK, fps=Fraction(25), model_rate=RATE) as a:
        a.probe(10**6)
        x = a.model_audio(0, a.total_frames)
    rng = np.random.default_rng(0)
    starts = [*range(0, len(x) - 3 * RATE, 3 * RATE), *rng.integers(0, len(x) - 3 * RATE, 4)]
    noisy = np.clip(0.5 * x + rng.normal(0, 0.01, len(x)).astype(np.float32), -1, 1)
    root = model_dir()
    settings = dict(hmm=str(root / "en-us"), allphone=str(root / "en-us-phone.lm.bin"), samprate=RATE,
                    loglevel="FATAL", **phones._SEARCH)
    binding, ours = Decoder(**settings), phones.SphinxDecoder(**settings)
    for audio in (x, noisy):
        for start in starts:
            pcm = (np.clip(audio[start : start + int(2.64 * RATE)], -1, 1) * 32767).astype(np.int16)
            binding.reinit_feat()
            binding.start_utt()
            binding.process_raw(pcm.tobytes(), full_utt=True)
            binding.end_utt()
            heard = [(s.word, s.start_frame, s.end_frame) for s in binding.seg()]
            assert ours.segments(pcm) == heard and len(heard) > 5


def test_short_pauses_in_speech_become_closures():
    n = int(0.4 * RATE)
    t = np.arange(n) / RATE
    low = np.sin(2 * np.pi * 300 * t).astype(np.float32)  # a dull release: lips
    high = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    high = np.diff(high, prepend=0).astype(np.float32)  # mostly above 3 kHz: tongue
    phones = (Phone("AA", 0.0, 0.1), Phone("SIL", 0.1, 0.2), Phone("AA", 0.2, 0.4))
    for burst, expected in ((low, ["T", "B"]), (high, ["T"])):
        out = stop_closures(phones, np.concatenate([np.zeros(int(0.2 * RATE), np.float32), burst]))
        assert [p.label for p in out] == ["AA", *expected, "AA"]
        assert out[1].start == 0.1 and all(a.end == b.start for a, b in zip(out, out[1:]))
        # A lip closure leaves the pause's first GAP_LEAD_S to the teeth, and shuts at least GAP_CLOSURE_S.
        assert out[-2].start == pytest.approx(0.2 - GAP_CLOSURE_S if expected[-1] == "B" else 0.1)
    longer = (Phone("AA", 0.0, 0.1), Phone("SIL", 0.1, 0.3), Phone("AA", 0.3, 0.4))
    out = stop_closures(longer, np.concatenate([np.zeros(int(0.3 * RATE), np.float32), low[: int(0.1 * RATE)]]))
    assert [(p.label, round(p.start, 3)) for p in out[1:3]] == [("T", 0.1), ("B", round(0.1 + GAP_LEAD_S, 3))]
    long_pause = (Phone("AA", 0.0, 0.1), Phone("SIL", 0.1, 0.5), Phone("AA", 0.5, 0.6))
    assert stop_closures(long_pause, np.zeros(RATE, np.float32))[1].label == "SIL"


def _tone(seconds: float, *freqs: float, level: float = 0.3) -> np.ndarray:
    t = np.arange(int(seconds * RATE)) / RATE
    return (level * sum(np.sin(2 * np.pi * f * t) for f in freqs) / len(freqs)).astype(np.float32)


def test_loud_stretches_of_a_long_pause_are_sound_and_murmurs_closures():
    # The recogniser called 0.1-0.88 s a pause (a filler): silence, a vowel, a low murmur, the vowel again.
    silence = np.zeros(int(0.3 * RATE), np.float32)
    vowel = _tone(0.15, 700, 2500, 3500)  # (energy above 3 kHz: its onset is not a lip release)
    murmur = _tone(0.08, 180, 250, level=0.1)  # a voice behind closed lips: all of it low, steady, softer
    audio = np.concatenate([_tone(0.1, 700, 1200), silence, vowel, murmur, vowel, _tone(0.1, 700, 1200)])
    phones = (Phone("AA", 0.0, 0.1), Phone("SIL", 0.1, 0.78), Phone("AA", 0.78, 0.88))
    out = stop_closures(phones, audio)
    assert [p.label for p in out] == ["AA", "SIL", "AH", "M", "AH", "AA"]
    assert out[3].start == pytest.approx(0.55, abs=0.03) and out[3].end == pytest.approx(0.63, abs=0.03)
    assert all(a.end == b.start for a, b in zip(out, out[1:]))  # still covering the window, in order
    # Without the murmur the loud stretch is one sound; a quiet pause stays a pause.
    plain = np.concatenate([_tone(0.1, 700, 1200), silence, vowel, _tone(0.08, 700, 2500, 3500), vowel,
                            _tone(0.1, 700, 1200)])
    assert [p.label for p in stop_closures(phones, plain)] == ["AA", "SIL", "AH", "AA"]
    quiet = np.concatenate([_tone(0.1, 700, 1200), np.zeros(int(0.68 * RATE), np.float32), _tone(0.1, 700, 3500)])
    assert [p.label for p in stop_closures(phones, quiet)] == ["AA", "SIL", "AA"]


def test_the_recogniser_hears_over_a_noise_floor_where_the_recording_has_none():
    # A synthetic voice: its stop closures are digital silence, out of what the acoustic model learnt from.
    vowel = _tone(0.2, 700, 1200)
    clean = np.concatenate([vowel, np.zeros(int(0.1 * RATE), np.float32), vowel])
    heard = with_floor(clean)
    levels = frame_levels(heard)
    assert levels[22:28].mean() == pytest.approx(levels.max() - FLOOR_BELOW_PEAK_DB, abs=2.0)
    assert np.abs(heard - clean)[:2000].max() < 0.01 and np.array_equal(heard, with_floor(clean))  # seeded
    # A recording with its own floor that high, or a little lower (a room's noise), is heard as it is.
    rng = np.random.default_rng(2)

    def under_floor(db: float) -> np.ndarray:  # the recording over white noise FLOOR_BELOW_PEAK_DB + db under its vowel
        scale = np.sqrt(np.mean(clean[:3200] ** 2)) * 10 ** (-(FLOOR_BELOW_PEAK_DB + db) / 20)
        return clean + rng.standard_normal(len(clean)).astype(np.float32) * np.float32(scale)

    for db in (0.0, FLOOR_MARGIN_DB - 2):
        noisy = under_floor(db)
        assert with_floor(noisy) is noisy
    lower = frame_levels(with_floor(under_floor(FLOOR_MARGIN_DB + 4)))
    assert lower[22:28].mean() == pytest.approx(levels.max() - FLOOR_BELOW_PEAK_DB, abs=2.0)


def test_quiet_stretches_the_recogniser_named_are_pauses():
    # Over room noise, a stop's closure heard as a th: the quiet inside it becomes a pause, the rest stays a th.
    noise = 0.001 * np.random.default_rng(3).standard_normal(int(0.1 * RATE)).astype(np.float32)
    audio = np.concatenate([_tone(0.2, 700, 1200), noise, _tone(0.2, 700, 1200)])
    phones = (Phone("AA", 0.0, 0.18), Phone("TH", 0.18, 0.32), Phone("AA", 0.32, 0.5))
    out = quiet_gaps(phones, audio)
    assert [(p.label, round(p.start, 2), round(p.end, 2)) for p in out] == [
        ("AA", 0.0, 0.18), ("TH", 0.18, 0.2), ("SIL", 0.2, 0.3), ("TH", 0.3, 0.32), ("AA", 0.32, 0.5)]
    # Loud sounds, and a quiet stretch shorter than QUIET_S, are left as heard.
    short = np.concatenate([_tone(0.2, 700, 1200), noise[: int(0.02 * RATE)], _tone(0.28, 700, 1200)])
    assert quiet_gaps(phones, short) == phones
    assert quiet_gaps(phones, _tone(0.5, 700, 1200)) == phones


def test_speech_after_a_pause_with_a_low_onset_starts_from_closed_lips():
    n = int(0.3 * RATE)
    low = _tone(0.3, 300)
    high = np.diff(np.random.default_rng(1).standard_normal(n), prepend=0).astype(np.float32)  # an s or a t
    phones = (Phone("SIL", 0.0, 0.6), Phone("AA", 0.6, 0.9))
    for onset, expected in ((low, ["SIL", "B", "AA"]), (high, ["SIL", "AA"])):
        out = stop_closures(phones, np.concatenate([np.zeros(int(0.6 * RATE), np.float32), onset]))
        assert [p.label for p in out] == expected
    assert out[0].end == 0.6 and stop_closures(phones, np.concatenate([np.zeros(int(0.6 * RATE)), low]))[1].start == (
        pytest.approx(0.5)
    )


def test_an_aligned_stop_is_shut_over_all_of_its_silent_closure():
    """A p the words place over 0.25 s: its closure is silence, shut all through (not only its last 60 ms, which
    left the lips open in the middle of "pumpkin pie"'s long p); the loud start of a long segment is not."""
    audio = np.concatenate([_tone(0.3, 700, 1200), np.zeros(int(0.25 * RATE), np.float32), _tone(0.3, 700, 3500)])
    out = lip_closures((Phone("AA", 0.0, 0.3), Phone("P", 0.3, 0.55), Phone("AY", 0.55, 0.85)), audio)
    shut = [p for p in out if p.label == "P"]
    assert shut[0].start == pytest.approx(0.3, abs=0.011) and shut[-1].end == 0.55
    assert all(p.end - p.start <= 0.08 + 1e-9 for p in shut)  # (in pieces of one closure each)
    times = np.arange(0.31, 0.55, 0.02)
    assert (mouth_targets(out, times)[:, 0] < -0.5).all()
    loud = lip_closures((Phone("P", 0.0, 0.55), Phone("AY", 0.55, 0.85)), audio)
    assert loud[0].label == "HH" and loud[0].end == pytest.approx(0.3, abs=0.011)


def test_a_closure_longer_than_one_keeps_the_lips_shut_until_its_release():
    """A stop's silent closure named a B (0.17 s: the pause in "bread, plums") is shut all along, up to the release
    that ends it, not only over one closure's length around its middle (which opened the lips 40 ms early)."""
    phones = (Phone("AA", 0.3, 0.5), Phone("T", 0.5, 0.54), Phone("B", 0.54, 0.71), Phone("T", 0.71, 0.75),
              Phone("L", 0.75, 0.82), Phone("AH", 0.82, 1.0))
    times = np.arange(0.56, 0.7, 0.01)
    assert (mouth_targets(phones, times)[:, 0] < -0.5).all()
    assert mouth_targets(phones, np.array([0.4, 0.85]))[:, 0].min() > 0.3  # open on both sides


def test_a_tongue_stop_heard_where_the_lips_made_it_is_a_lip_closure():
    """The recogniser names many a b or p a k, t or g ("brother" heard as G R). The lips made it where its release
    burst is low-pitched and the vowel after it starts with its second formant low; a t's or k's keeps its name."""
    closure = np.zeros(int(0.06 * RATE), np.float32)
    dull = _tone(0.012, 400, 800, level=0.5)  # a burst with its energy under 1.5 kHz
    sharp = np.diff(np.random.default_rng(4).standard_normal(int(0.012 * RATE)), prepend=0).astype(np.float32)
    low_f2, high_f2 = _tone(0.25, 700, 1100), _tone(0.25, 700, 1900)  # second formants of a lip's and a tongue's
    phones = (Phone("AA", 0.0, 0.2), Phone("K", 0.2, 0.3), Phone("AA", 0.3, 0.55))
    for burst, vowel, lips in ((dull, low_f2, True), (dull, high_f2, False), (sharp, low_f2, False)):
        out = stop_closures(phones, np.concatenate([_tone(0.2, 700, 1200), closure, burst, vowel]))
        if not lips:
            assert out == phones
            continue
        assert [p.label for p in out] == ["AA", "B", "HH", "AA"]
        assert out[1].start == 0.2 and out[1].end == pytest.approx(0.26, abs=0.006)  # shut up to the release
        assert all(a.end == b.start for a, b in zip(out, out[1:]))
    # Under noise within LIP_BURST_CLEAR_DB of the burst, its spectrum is the noise's: not read.
    audio = np.concatenate([_tone(0.2, 700, 1200), closure, dull, low_f2])
    noise = np.random.default_rng(5).standard_normal(len(audio)).astype(np.float32)
    burst_rms = float(np.sqrt(np.mean(dull**2)))
    assert stop_closures(phones, audio + noise * np.float32(burst_rms * 10 ** (-12 / 20))) == phones


def test_lips_stay_shut_through_the_quiet_after_a_closure():
    # "pumpkin": the m's murmur, then the p's silent closure, which the recogniser put into the k after it.
    audio = np.concatenate([_tone(0.2, 700, 1200), _tone(0.1, 200, level=0.1), np.zeros(int(0.15 * RATE), np.float32),
                            _tone(0.2, 700, 3500)])
    phones = (Phone("AA", 0.0, 0.22), Phone("M", 0.22, 0.3), Phone("K", 0.3, 0.47), Phone("IH", 0.47, 0.65))
    out = stop_closures(phones, audio)
    assert [p.label for p in out] == ["AA", "M", "P", "K", "IH"]
    assert out[2].start == 0.3 and out[2].end == pytest.approx(0.45, abs=0.011) and out[3].end == 0.47
    # After a vowel the same quiet is a stop's own closure: left to it.
    assert [p.label for p in stop_closures((phones[0], Phone("K", 0.2, 0.47), phones[3]), audio)] == ["AA", "K", "IH"]


def test_a_long_lip_closure_is_shut_up_to_its_release():
    # The recogniser's B took in the vowel before it: only its end is the closure.
    audio = np.concatenate([_tone(0.3, 700, 1200), np.full(int(0.1 * RATE), 1e-4, np.float32), _tone(0.2, 700)])
    out = stop_closures((Phone("AA", 0.0, 0.2), Phone("B", 0.2, 0.4), Phone("AA", 0.4, 0.6)), audio)
    assert out == (Phone("AA", 0.0, 0.2), Phone("HH", 0.2, 0.32), Phone("B", 0.32, 0.4), Phone("AA", 0.4, 0.6))
    # "young man": the M took in the quieter ng before it; the lips close for the m, which ends at the vowel.
    audio = np.concatenate([_tone(0.2, 700, 1200), _tone(0.1, 250, level=0.02), _tone(0.08, 200, level=0.1),
                            _tone(0.2, 700, 1200)])
    out = stop_closures((Phone("AH", 0.0, 0.2), Phone("M", 0.2, 0.38), Phone("AE", 0.38, 0.58)), audio)
    assert [p.label for p in out] == ["AH", "HH", "M", "AE"]
    assert out[2].start == pytest.approx(0.3) and out[2].end == 0.38


def test_visemes_close_for_m_and_spread_ee_rounded_oo():
    phones = (
        Phone("SIL", 0, 0.3),
        Phone("AA", 0.3, 0.5),
        Phone("M", 0.5, 0.58),
        Phone("AA", 0.58, 0.8),
        Phone("IY", 0.8, 1.1),
        Phone("SIL", 1.1, 1.4),
        Phone("UW", 1.4, 1.7),
        Phone("SIL", 1.7, 2.4),
    )
    times = np.arange(0.02, 2.4, 0.04)
    shapes = mouth_targets(phones, times)
    at = lambda s: shapes[int(np.argmin(np.abs(times - s)))]  # noqa: E731
    assert at(0.54)[0] < -0.6 and at(0.5)[0] < -0.4  # m: closed over its segment (closing at its start)
    assert at(0.36)[0] > 0.4 and at(0.7)[0] > 0.4  # a: open on both sides of it
    assert at(0.95)[1] > 0.6 and at(1.55)[1] < -0.6  # ee spread, oo rounded
    assert at(2.3)[0] < -0.9 and abs(at(2.3)[1]) < 0.05  # a pause: lips together (motion.pause_track relaxes long ones)
    d = np.diff(shapes[:, 0])
    assert not np.any(
        (np.abs(d[:-1]) > 0.5) & (np.abs(d[1:]) > 0.5) & (np.sign(d[:-1]) != np.sign(d[1:]))
    )  # no one-frame shapes


def test_blinks_and_nods_replay_exactly_in_an_i_chunk():
    fps = Fraction(25)
    energy = np.where(np.arange(100) % 20 < 6, -15.0, -45.0).astype(np.float32)
    carry = MotionCarry()
    tracks, heads = [], []
    for start in (0, 50):
        blink, carry = blink_track(start, 50, carry, fps=fps, interval_s=1.0, seed=3, advance=True)
        carry = emphasis(start, energy[start : start + 50], carry, fps=fps)
        tracks.append(blink)
        heads.append(head_track(start, 50, carry, fps=fps, amount=1.0, seed=3))
    assert carry.nods and carry.blink_starts
    # An I chunk over frames 40..60 runs with the carry left after the second N chunk.
    again, same = blink_track(40, 20, carry, fps=fps, interval_s=1.0, seed=3, advance=False)
    assert same is carry
    assert np.array_equal(again, np.concatenate(tracks)[40:60])
    head = head_track(40, 20, carry, fps=fps, amount=1.0, seed=3)
    assert np.allclose(head, np.concatenate(heads)[40:60], atol=1e-6)
    assert np.concatenate(tracks).max() == 1.0 and 0 < (np.concatenate(tracks) > 0.5).sum() < 40


def test_an_i_chunk_keeps_a_closure_heard_with_more_around_it():
    """At a seam (frame 50) each N chunk heard the audio up to 7 frames past its own. The earlier one heard an m at
    frames 47-49, inside its own frames; the later one, at the start of its window, heard a v there. The I chunk
    shuts the lips as the earlier one did (the crossfade alone left them half shut); a closure only the later chunk
    heard before the seam is crossfaded as before."""
    def anchor(first: int, shut: tuple[int, ...]) -> MotionAnchor:
        mouth = np.tile(np.float32([0.6, 0.0]), (64, 1))
        mouth[[f - first for f in shut], 0] = -1.0
        params = np.zeros(len(PARAMS), np.float32)
        params[OPEN] = 0.6  # (at the anchor frames, 44 and 55: open)
        return MotionAnchor(params=params, first=first, mouth=mouth)

    plan = ChunkPlan(kind="I", index=0, start=45, end=55, publish_start=45, publish_end=55, context=(),
                     anchors=(44, 55), keep=(), last=False)

    def between(before: MotionAnchor, after: MotionAnchor) -> np.ndarray:
        x = ChunkInput(plan=plan, fps=Fraction(25), audio=np.zeros(0, np.float32), audio_rate=RATE, audio_pad_s=0.32,
                       anchors=(before, after), seed=0)
        animator = PreviewAnimator(mouth_gain=1.0, lip_shape=1.0, blink_interval_s=0.0, head_motion=0.0)
        got, _ = animator.run(SpeechFeatures(chunk=x, first=45, energy_db=np.zeros(10, np.float32), targets=None),
                              static=None, carry=MotionCarry())
        return got.params[:, OPEN]  # frames 45..54

    opening = between(anchor(-7, (47, 48, 49)), anchor(43, ()))
    assert (opening[2:5] < -0.95).all() and (opening[6:] > 0.3).all()
    later = between(anchor(-7, ()), anchor(43, (47, 48, 49)))
    assert (later[2:5] > -0.9).all()  # (before the seam the earlier chunk heard more of it)


def test_loudness_scales_openings_not_closures():
    targets = np.array([[0.5, 0.0], [0.5, 0.0], [-1.0, 0.0], [0.5, 0.5]], np.float32)
    peak = np.full(4, -10.0, np.float32)
    quiet = motion.shape_mouth(targets, np.full(4, -33.0, np.float32), peak, gain=1.0)
    loud = motion.shape_mouth(targets, np.full(4, -10.0, np.float32), peak, gain=1.0)
    silent = motion.shape_mouth(targets, np.full(4, -80.0, np.float32), peak, gain=1.0)
    paused = motion.shape_mouth(targets, np.full(4, -80.0, np.float32), peak, gain=1.0, pause=np.ones(4, np.float32))
    assert loud[0, 0] > quiet[0, 0] > 0 and loud[2, 0] == -1.0
    assert np.all(silent == 0)  # no pause track: the reference's mouth
    assert np.all(paused[:, 0] == -motion.PAUSE_CLOSE) and np.all(paused[:, 1] == 0)  # lips closed in a pause


def test_a_quiet_recording_is_heard_at_a_usual_level():
    syllables = np.tile(np.array([-12.0, -12.0, -20.0, -120.0], np.float32), 20)  # speech, pauses of silence
    # At a usual level: heard as it is.
    same, speech_db = motion.lifted(syllables, None)
    assert same is syllables and speech_db == -12.0
    # 35 dB quieter: lifted so its speech peaks at QUIET_PEAK_DB, and so is what follows (a pause, a noise).
    quiet, speech_db = motion.lifted(syllables - 35, None)
    assert np.allclose(quiet, syllables - 35 + (motion.QUIET_PEAK_DB + 47)) and speech_db == -47.0
    later, speech_db = motion.lifted(np.full(10, -90.0, np.float32), speech_db)
    assert np.allclose(later, -90 + motion.QUIET_PEAK_DB + 47) and speech_db == -47.0
    # Steady noise is not speech: a recording that starts with it is not lifted (its noise stays a silence).
    noise = (-60 + np.random.default_rng(0).uniform(-3, 3, 80)).astype(np.float32)
    assert motion.lifted(noise, None) == (noise, None)
    # Louder speech later lowers the lift, never below none.
    assert motion.lifted(syllables, -47.0)[1] == -12.0


def test_a_dc_offset_is_not_read_as_sound():
    speech = np.concatenate([_tone(0.3, 700, 1200), np.zeros(int(0.3 * RATE), np.float32)] * 3)
    assert motion.without_offset(speech, rate=RATE) is speech  # (its own means scatter about zero)
    shifted = speech + np.float32(0.02)
    level = motion.frame_energy_db(motion.without_offset(shifted, rate=RATE), rate=RATE, fps=Fraction(25), first=0,
                                   num_frames=40, pad_s=0.0, window_start=0)
    assert level[10:14].max() < motion.SILENCE_DB  # the pause is a pause again (-34 dBFS with the offset)
    assert np.allclose(motion.without_offset(shifted, rate=RATE), speech, atol=1e-6)


def test_the_zeros_padding_a_window_past_a_recording_with_an_offset_stay_silence():
    """A window is padded with zeros before the recording's start and past its end: an offset taken out of those too
    made a step as loud as the offset at the recording's edge, and the speech beside it read as quiet (a mouth nearly
    still). Taken out of the recording alone, even where it fills a fifth of the window."""
    speech = np.concatenate([_tone(0.3, 700, 1200), np.zeros(int(0.3 * RATE), np.float32)] * 2)  # 1.2 s
    shifted = speech + np.float32(0.5)
    for before, after in ((int(0.32 * RATE), 0), (0, int(4.8 * RATE)), (int(0.32 * RATE), int(0.32 * RATE))):
        window = np.concatenate([np.zeros(before, np.float32), shifted, np.zeros(after, np.float32)])
        out = motion.without_offset(window, rate=RATE)
        assert not out[:before].any() and not out[len(out) - after :].any()
        assert np.allclose(out[before : before + len(speech)], speech, atol=1e-5)
        level = motion.frame_energy_db(out, rate=RATE, fps=Fraction(25), first=0, num_frames=len(out) * 25 // RATE,
                                       pad_s=0.0, window_start=0)
        assert level.max() < motion.frame_energy_db(speech, rate=RATE, fps=Fraction(25), first=0, num_frames=30,
                                                    pad_s=0.0, window_start=0).max() + 0.5


def test_pause_closes_the_lips_then_goes_back_to_the_reference():
    fps = Fraction(25)
    speech = np.zeros(300, np.float32)
    speech[50:100] = 1.0
    track, last = motion.pause_track(0, speech, -1, start=0, end=300, fps=fps)
    assert np.all(track[:50] == 0)  # before any speech: the reference's mouth
    hold = round(motion.PAUSE_HOLD_S * 25)
    assert np.all(track[100 : 99 + hold] == 1.0) and track[-1] == 0.0  # closed after speech, back later
    assert np.all(np.diff(track[99 + hold :]) <= 0) and last == 99
    # Chunk by chunk, with the carry, the same track (lookahead frames included).
    a, carry = motion.pause_track(0, speech[:130], -1, start=0, end=120, fps=fps)
    b, _ = motion.pause_track(110, speech[110:], carry, start=120, end=300, fps=fps)
    assert np.array_equal(a, track[:130]) and np.array_equal(b[10:], track[120:])


@pytest.fixture(scope="module")
def example():
    return rig_for(512, 512)


def test_rest_is_the_reference_and_teeth_stay_the_references(example):
    rig = example.rig
    assert np.array_equal(render_frame(rig, row()), rig.image)  # nothing painted at rest
    opened = render_frame(rig, row(open_=0.6)).astype(np.float32)
    ref = rig.image.astype(np.float32)
    up, low = rig.teeth.upper > 0.99, rig.teeth.lower > 0.99
    assert up.sum() + low.sum() > 50  # the example smiles: teeth at rest
    b = rig.mouth_bank.rect
    d_up, _ = rig.mouth.teeth(0.6)
    # The upper teeth moved with the upper lip, not repainted: the reference's pixels, shifted by the lip's
    # travel (the edge of the teeth, where they meet the lips or the opened mouth, left out).
    inner = cv2.erode(up.astype(np.uint8), np.ones((3, 3), np.uint8)) > 0
    ys, xs = np.nonzero(inner)
    ys, xs = ys + b.y0, xs + b.x0
    moved = cv2.remap(
        rig.image, (xs - d_up[0]).astype(np.float32)[None], (ys - d_up[1]).astype(np.float32)[None], cv2.INTER_LINEAR
    )[0].astype(np.float32)
    assert len(ys) > 50 and np.abs(opened[ys, xs] - moved).mean() < 6
    # Below them, half way to the lowered lower lip, the mouth has opened: darker than the lower lip was.
    d_low = rig.mouth.teeth(0.6)[1]
    gap = rig.mesh.points[14] + d_up + 0.5 * (d_low - d_up)
    assert opened[int(gap[1]), int(gap[0])].mean() < 0.6 * ref[int(rig.mesh.points[14][1]) + 6, int(gap[0])].mean()


def test_closures_blinks_and_head_motion_move_only_their_parts(example):
    rig = example.rig
    ref = rig.image.astype(np.int16)
    m = rig.mesh
    closed = render_frame(rig, row(open_=-1.0)).astype(np.int16)
    blink = render_frame(rig, row(blink=1.0)).astype(np.int16)
    eye = m.left_eye_centre.astype(int)
    mouth = m.mouth_centre.astype(int)
    assert np.abs(closed - ref)[mouth[1] - 3 : mouth[1] + 3, mouth[0] - 10 : mouth[0] + 10].mean() > 20  # teeth covered
    assert np.abs(closed - ref)[eye[1] - 5 : eye[1] + 5].mean() < 0.05  # the eyes did not move
    assert np.abs(blink - ref)[eye[1] - 2 : eye[1] + 2, eye[0] - 5 : eye[0] + 5].mean() > 20  # lid over the eye
    assert np.abs(blink - ref)[mouth[1] - 5 : mouth[1] + 5].max() == 0
    turned = render_frame(rig, row(dx=0.02, roll=2.0)).astype(np.int16)
    assert np.abs(turned - ref)[:3].max() == 0 and np.abs(turned - ref)[:, -3:].max() == 0  # background still
    assert np.abs(turned - ref)[eye[1] - 5 : eye[1] + 5].mean() > 5


def test_the_head_moves_whole_out_past_its_outline_on_a_wide_face(tmp_path):
    """The face's sides, ears and hair at the temples (its outline grown by a quarter) move with the head, not
    with the band that fades its motion into the background: on the example and on it stretched 1.35x wide. (The
    head's ellipse alone: a person segmentation keeps it off the background beside them, test_preview_backdrop.py.)"""
    from PIL import Image

    from avatar_render.preview.rig import build_rig

    image = load_reference(FACE)
    wide = tmp_path / "wide_face.png"
    Image.fromarray(cv2.resize(image, (round(image.shape[1] * 1.35), image.shape[0]))).save(wide)
    for ref in (FACE, wide):
        rig = rig_for(512, 512, ref=ref).rig
        head, oval = build_rig(rig.image, rig.mesh).head, rig.mesh.at(fm.FACE_OVAL)
        grown = (oval.mean(axis=0) + (oval - oval.mean(axis=0)) * 1.25).astype(np.float32)
        x, y = (grown[:, 0] - head.rect.x0 - 1) / 2, (grown[:, 1] - head.rect.y0 - 1) / 2  # (weights: every 2nd px)
        weight = cv2.remap(head.weight, x[None], y[None], cv2.INTER_LINEAR, borderMode=cv2.BORDER_CONSTANT)[0]
        assert weight.min() > 0.95
        assert head.weight[:, 0].max() < 0.01 and head.weight[:, -1].max() < 0.01  # and still faded out by its edges


@pytest.mark.parametrize("size", [(256, 256), (1280, 720), (720, 1280), (32, 32)])
def test_any_size_and_shape(size):
    static = rig_for(*size)
    frame = render_frame(static.rig, row(open_=0.5, width=-0.5, blink=0.5, dx=0.01, roll=1.0))
    assert frame.shape == (size[1], size[0], 3)
    assert (static.rig.mouth is None) == (size == (32, 32))  # too small a face to animate: only the head moves


def test_face_off_centre_and_template_fallback(tmp_path):
    from PIL import Image

    canvas = np.full((600, 1000, 3), 200, np.uint8)
    canvas[60:572, 40:552] = load_reference(FACE)  # the face in the left half of a landscape picture
    path = tmp_path / "wide.png"
    Image.fromarray(canvas).save(path)
    for setting in ("auto", "template"):
        static = rig_for(640, 360, f"face.landmarks={setting}", ref=path)
        assert static.face_detected and static.landmarks == (
            "model" if setting == "auto" and find_model() else "template"
        )
        frame = render_frame(static.rig, row(open_=0.5))
        assert np.abs(frame.astype(np.int16) - static.rig.image).max() > 30  # the mouth moved


def test_a_picture_without_a_face_is_shown_still(tmp_path):
    """No face found: a mouth drawn where one is only assumed lands on whatever is there (a tie, a wall), so the
    picture is shown as it is in every frame, and the warning says so."""
    from PIL import Image

    rng = np.random.default_rng(0)
    texture = cv2.GaussianBlur(rng.integers(0, 255, (300, 400, 3), dtype=np.uint8), (0, 0), 3)
    path = tmp_path / "cloth.png"
    Image.fromarray(texture).save(path)
    static = rig_for(256, 256, ref=path)
    assert not static.face_detected and static.landmarks == "fallback" and "shown still" in static.face_note
    for p in (row(open_=0.8, width=-0.5, blink=1.0, dx=0.02, roll=2.0), row(open_=-1.0, zoom=0.03)):
        assert np.array_equal(render_frame(static.rig, p), static.rig.image)


def test_the_template_on_a_smile_shows_its_teeth_and_shuts_over_them():
    """Without the landmark model, the example's smile: the template's lips opened around its teeth, the rig
    moves them as the reference's own (not a generated interior over split teeth) and lips pressed shut hide them."""
    rig = rig_for(512, 512, "face.landmarks=template").rig
    assert rig.mesh.source == "template" and rig.teeth.visible and rig.synth is None
    grey = lambda a: a.astype(np.float32) @ np.array([0.299, 0.587, 0.114], np.float32)  # noqa: E731
    inner = np.concatenate([rig.mesh.at(fm.LIPS_INNER_UPPER), rig.mesh.at(fm.LIPS_INNER_LOWER)[::-1]])
    mouth = np.zeros(rig.image.shape[:2], np.uint8)
    cv2.fillPoly(mouth, [np.round(inner).astype(np.int32)], 1)
    teeth = (mouth > 0) & (grey(rig.image) > 200)  # (the opened lips reach over the teeth, onto pale lips)
    assert teeth.sum() > 40
    shut = render_frame(rig, row(-1.0))
    assert (grey(shut)[teeth] > 200).sum() < 0.25 * teeth.sum()


def test_the_template_opens_its_lips_beyond_the_teeth_it_finds():
    """The teeth's darker edges (by the gums, in the lips' shadow) escape the teeth search: the template's inner
    lips open OVER (at least 0.05) mouth widths beyond the teeth found (above and below, in the middle of the
    mouth), so that lips pressed shut cover them (a 1-px margin left a line of them between the shut lips: on
    a smile, the mouth read open in silence at 13-15 % of its speech opening)."""
    from avatar_render.face.detect import FaceDetector, choose_face
    from avatar_render.face.fit import fit_to_frame
    from avatar_render.face.teeth import OVER, open_to_teeth, teeth_patch

    ref = load_reference(FACE)
    layout, _ = choose_face(ref, FaceDetector(), None)
    image, fit = fit_to_frame(ref, 512, 512, focus=(layout.face.x, layout.face.y, layout.face.w, layout.face.h))
    closed = fm.template_mesh(layout).mapped(fit)
    teeth, opened = teeth_patch(image, closed), open_to_teeth(image, closed)
    w, c = closed.mouth_width(), closed.mouth_centre
    up, low = opened.at(fm.LIPS_INNER_UPPER), opened.at(fm.LIPS_INNER_LOWER)
    above, below = [], []
    for x in range(int(c[0] - 0.2 * w), int(c[0] + 0.2 * w) + 1):
        ys = np.flatnonzero(teeth[:, x])
        if len(ys) >= 2:
            above.append(ys.min() + 0.5 - np.interp(x + 0.5, *up[np.argsort(up[:, 0])].T))
            below.append(np.interp(x + 0.5, *low[np.argsort(low[:, 0])].T) - ys.max() - 0.5)
    assert len(above) > 0.3 * w
    assert OVER >= 0.05
    assert np.median(above) >= 0.05 * w and np.median(below) >= 0.05 * w, (np.median(above), np.median(below))


def test_the_template_widens_its_mouth_to_a_smile_wider_than_it():
    """A smile is wider than the template's mouth: the teeth and the dark of its corners beyond the template's
    corners stayed in view with the lips shut. The template is widened to the mouth's opening and OVER beyond,
    its lips moving with their corners; a mouth whose opening fits (the example's) leaves it as it was."""
    from avatar_render.face.detect import FaceDetector, choose_face
    from avatar_render.face.fit import fit_to_frame
    from avatar_render.face.teeth import MAX_WIDEN, OVER, teeth_patch, widen_to_teeth

    ref = load_reference(FACE)
    layout, _ = choose_face(ref, FaceDetector(), None)
    image, fit = fit_to_frame(ref, 512, 512, focus=(layout.face.x, layout.face.y, layout.face.w, layout.face.h))
    closed = fm.template_mesh(layout).mapped(fit)
    assert widen_to_teeth(image, closed) is closed
    ex, ey = closed.axes()
    c = closed.mouth_centre
    corners = np.array([(closed.points[i] - c) @ ex for i in (61, 291)])
    teeth = teeth_patch(image, closed)
    ys, xs = np.nonzero(teeth)
    t_mid = float(np.median(np.stack([xs + 0.5 - c[0], ys + 0.5 - c[1]], axis=1) @ ey))
    smile = image.copy()  # the mouth's dark drawn out to 1.25 times the template's corners either side
    for s in np.arange(1.25 * corners[0], 1.25 * corners[1], 0.25):
        for t in np.arange(t_mid - 2, t_mid + 2, 0.25):
            x, y = (c + s * ex + t * ey).astype(int)
            if abs(s) > 8 and not teeth[y, x]:
                smile[y, x] = (12, 10, 10)
    wide = widen_to_teeth(smile, closed)
    after = np.array([(wide.points[i] - c) @ ex for i in (61, 291)])
    reach = 1.25 * np.abs(corners) + OVER * closed.mouth_width()
    assert np.all(np.abs(after) >= np.minimum(reach, MAX_WIDEN * np.abs(corners)) - 0.5), (corners, after)
    assert np.all(np.abs(after) <= MAX_WIDEN * np.abs(corners) + 1e-3)
    for ring in (fm.LIPS_OUTER_UPPER, fm.LIPS_INNER_UPPER, fm.LIPS_INNER_LOWER, fm.LIPS_OUTER_LOWER):
        s = (wide.at(ring) - c) @ ex
        assert np.all(np.diff(s) > 0)  # (each lip's points keep their order along it)
    far = np.linalg.norm(closed.points - c, axis=1) > 3 * closed.mouth_width()
    assert np.array_equal(wide.points[far], closed.points[far])  # (the eyes, the brows, the face's outline)


def test_a_short_first_chunk_publishes_the_first_frames_early(tmp_path):
    """chunk.first_frames reaches the preview's chunk sizes: N0 holds that many frames and goes out first;
    the chunks after it keep their size."""
    from avatar_render.pipeline.types import Published
    from tests.media import speech_like, write_audio

    audio = write_audio(tmp_path / "a.wav", speech_like(6.0, 16000, seed=3), 16000)
    starts = {}
    for first in (0, 8):
        cfg = load_config(None, ("video.width=128", "video.height=128", f"chunk.first_frames={first}"))
        pipe = build_preview(cfg)
        assert pipe.sizes.first == (first or cfg.chunk.chunk_frames)
        static = pipe.prepare(request_input(cfg, load_reference(FACE), FACE))
        with AudioReader(audio, fps=cfg.fps, model_rate=pipe.audio_rate) as reader:
            pubs = [p for p in pipe.stream(static, reader, seed=0) if isinstance(p, Published)]
        starts[first] = [(p.start, p.end) for p in pubs]
        assert pubs[-1].end == 150 and all(p.frames.shape[1:] == (128, 128, 3) for p in pubs)
    assert starts[8][0] == (0, 8 - cfg.chunk.transition_frames // 2)
    assert starts[0][0][1] > 8


@pytest.mark.skipif(find_model() is None, reason="face landmark model not installed (scripts/fetch_face_model.py)")
def test_the_measures_head_undo_finds_the_rendered_head_motion(example):
    """The identity measure undoes the head's motion read from the frame: on renders whose head motion is
    known (turned, nodded, zoomed, with the mouth rounded or open and a blink), it finds it within a
    fifth of a pixel over the still region, where the landmarks' pose alone is off by one to three."""
    from avatar_render.face.landmarks import LandmarkModel
    from avatar_render.metrics.face_track import FaceTracker, still_mask
    from avatar_render.preview.render import head_inverse

    rig = example.rig
    model = LandmarkModel(find_model())
    still = still_mask(rig.mesh, rig.image.shape[:2])
    tracker = FaceTracker(model, rig.mesh, image=rig.image, still=still)
    ys, xs = np.nonzero(still)
    pts = np.stack([xs, ys, np.ones_like(xs)], axis=1).astype(np.float64)
    errors = []
    for p in (
        row(open_=0.3, width=-0.9, dy=0.012, roll=-0.8),
        row(open_=0.6, width=0.9, dx=0.01, roll=1.2, zoom=0.005),
        row(open_=0.4, blink=1.0, dx=-0.006, dy=0.008, roll=0.6, zoom=-0.004),
    ):
        read = tracker.read(render_frame(rig, p))
        true = cv2.invertAffineTransform(head_inverse(rig, p))
        errors.append(np.abs(pts @ (read.head - true).T).max())
    assert max(errors) < 0.2, errors


@pytest.mark.skipif(find_model() is None, reason="face landmark model not installed (scripts/fetch_face_model.py)")
def test_the_measures_find_a_face_the_cascade_misses_where_the_reference_has_it(example):
    """Behind drawn spectacle frames the cascade can miss the first frame's face: the measures then start from
    the reference's landmarks instead of stopping."""
    from avatar_render.face.detect import FaceDetector
    from avatar_render.face.landmarks import LandmarkModel
    from avatar_render.metrics.face_track import FaceTracker

    class Blind(FaceDetector):
        def faces(self, image, **kwargs):
            return ()

    rig = example.rig
    tracker = FaceTracker(LandmarkModel(find_model()), rig.mesh)
    tracker._detector = Blind()
    read = tracker.read(render_frame(rig, row(open_=0.5, dx=0.01)))
    assert abs(read.mouth_width - rig.mesh.mouth_width() / rig.mesh.eye_distance) < 0.1
    assert read.lip_gap > rig.mesh.lip_gap() / rig.mesh.eye_distance  # the opened mouth is read


@pytest.mark.parametrize("size", [512, 1024])
def test_the_still_region_ends_where_its_mouth_region_begins(size):
    """The identity measure's still region stops at its mouth region's line, 0.15 eye distances above the nose
    tip, all across the face (the grown oval's own points lie too far apart on the sides to draw that line)."""
    from avatar_render.face import mesh as fm
    from avatar_render.metrics.face_track import still_mask

    mesh = rig_for(size, size).rig.mesh
    still = still_mask(mesh, (size, size))
    _, ey = mesh.axes()
    centre = mesh.at(fm.FACE_OVAL).mean(axis=0)
    line = float((mesh.points[1] - centre) @ ey) - 0.15 * mesh.eye_distance
    ys, xs = np.nonzero(still)
    t = (np.stack([xs + 0.5, ys + 0.5], axis=1) - centre) @ ey
    across = np.abs((xs + 0.5) - mesh.points[1][0]) < mesh.mouth_width()  # from cheek to cheek
    assert t[across].max() < line + 1.0
    assert t[across].max() > line - 2.0  # and down to it


def test_rounded_lips_leave_the_nose_as_it_is(example):
    """Rounding the lips draws the mouth in and the skin around it, not the nose: its lower part (wing to
    wing, from above its tip down to the skin under it) stays the reference's (it narrowed: 4 levels off on
    average at 512 px)."""
    rig = example.rig
    p = rig.mesh.points
    rounded = render_frame(rig, row(width=-1.0)).astype(np.int16)
    diff = np.abs(rounded - rig.image.astype(np.int16))
    x0, x1 = int(p[98][0]) - 1, int(p[327][0]) + 2
    y0, y1 = int(p[1][1]) - round(0.15 * rig.mesh.eye_distance), int(p[2][1])
    assert diff[y0:y1, x0:x1].mean() < 1.5
    assert float(np.hypot(*rig.mouth.displacement(0.0, -1.0)[61])) > 0.12 * rig.mouth.width_px  # the mouth narrows
