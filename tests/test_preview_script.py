"""The preview with the words spoken given (preview.transcript): phones aligned to them, m/b/p closed."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import wave
from fractions import Fraction
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from avatar_render.config import load_config
from avatar_render.errors import AvatarRenderError
from avatar_render.io.audio import AudioReader
from avatar_render.io.reference import load_reference
from avatar_render.job.setup import request_input
from avatar_render.pipeline.schedule import ChunkPlan
from avatar_render.pipeline.types import ChunkInput
from avatar_render.preview import script as script_module
from avatar_render.preview.engine import SpeechContext, build_preview
from avatar_render.preview.motion import CLOSURE_SATURATE
from avatar_render.preview.phones import LIPS, RATE, Phone, model_dir
from avatar_render.preview.script import Script, _share, align_script, read_transcript, words_of
from avatar_render.preview.spoken import guess_phones

ROOT = Path(__file__).resolve().parents[1]
FACE = ROOT / "examples" / "face.png"
TALK = ROOT / "examples" / "talk.wav"
needs_sphinx = pytest.mark.skipif(model_dir() is None, reason="pocketsphinx is not installed")


def talk_text() -> str:
    """The words of examples/talk.wav."""
    return (ROOT / "examples" / "talk.txt").read_text(encoding="utf-8")


def test_a_scripts_window_is_clipped_to_it_and_its_gaps_are_pauses():
    script = Script((Phone("M", 1.0, 1.125), Phone("AA", 1.125, 1.5), Phone("P", 2.0, 2.25)))
    assert script.window(1.0625, 2.0625) == (Phone("M", 0.0, 0.0625), Phone("AA", 0.0625, 0.4375),
                                             Phone("SIL", 0.4375, 0.9375), Phone("P", 0.9375, 1.0))
    assert script.window(3.0, 4.0) == (Phone("SIL", 0.0, 1.0),)
    first = script.window(0.5, 1.2)
    assert first[0] == Phone("SIL", 0.0, 0.5) and first[1].label == "M"


def test_the_words_of_a_transcript_and_the_marks_after_them():
    assert words_of("Good morning, Bill! It's nine o'clock.\nTwenty-two 'quoted'\n\n") == [
        ("good", False), ("morning", True), ("bill", True), ("it's", False), ("nine", False), ("o'clock", True),
        ("twenty", False), ("two", False), ("quoted", True)]


def test_each_stretch_of_speech_takes_the_words_that_fill_it():
    """Three stretches of 1, 2 and 1 s; words of 4 phones at 4 phones a second: one, two and one word; the
    mark after a word moves a boundary to it when the durations leave a choice."""
    assert _share([(0, 100), (150, 350), (400, 500)], np.full(4, 4.0), np.zeros(4, bool)) == [(0, 1), (1, 3), (3, 4)]
    counts = np.array([4.0, 4.0, 4.0, 4.0, 4.0, 4.0])
    assert _share([(0, 150), (200, 350)], counts, np.zeros(6, bool)) == [(0, 3), (3, 6)]
    assert _share([(0, 150), (200, 350)], counts, np.array([0, 1, 0, 0, 0, 1], bool)) == [(0, 2), (2, 6)]


def test_a_missing_or_empty_transcript_is_one_sentence(tmp_path):
    with pytest.raises(AvatarRenderError, match="was not found"):
        read_transcript(tmp_path / "none.txt")
    (tmp_path / "empty.txt").write_text(" ... \n")
    with pytest.raises(AvatarRenderError, match="has no words"):
        build_preview(load_config(None, (f"preview.transcript={tmp_path / 'empty.txt'}",)))


def whole_file_targets(static, context: SpeechContext) -> np.ndarray:
    """The mouth targets of talk.wav heard as one N chunk, from its frame 0: (frames, 2)."""
    with AudioReader(TALK, fps=Fraction(25), model_rate=RATE) as reader:
        reader.probe(10**6)
        n = reader.total_frames
        window = reader.model_audio(0, n, pad_s=0.32)
    plan = ChunkPlan("N", 0, 0, n, 0, n, (0, 0), (), (), True)
    x = ChunkInput(plan=plan, fps=Fraction(25), audio=window, audio_rate=RATE, audio_pad_s=0.32, anchors=(), seed=0)
    features, _ = context.run(x, static=static, carry=None)
    return features.targets[-features.first :]


@needs_sphinx
def test_the_transcripts_m_b_p_close_the_lips_where_the_recogniser_hears_other_sounds(tmp_path):
    """Every m, b and p of the words is a closure in the mouth's targets (the lips pressed together at its
    middle); the phone recogniser alone, on the same audio, leaves some of them open (it hears k, t or g)."""
    text = tmp_path / "talk.txt"
    text.write_text(talk_text())
    cfg = load_config(None, ("video.width=64", "video.height=64", f"preview.transcript={text}"))
    pipe = build_preview(cfg)
    static = pipe.prepare(request_input(cfg, load_reference(FACE), FACE, audio=TALK))
    assert static.script is not None and static.notes == ()
    context = next(s for s in pipe.generate if isinstance(s, SpeechContext))
    with_words = whole_file_targets(static, context)  # (aligns the stretches the set-up left)
    lips = [p for p in static.script.phones if p.label in LIPS]
    assert len(lips) >= 12  # morning, welcome, library, open, ... please, pleasant
    heard = whole_file_targets(dataclasses.replace(static, script=None), context)
    at = [min(round((p.start + p.end) / 2 * 25), len(with_words) - 2) for p in lips]

    def closed(targets: np.ndarray, f: int) -> bool:  # within a frame of the middle, the motion's full closure
        return targets[f - 1 : f + 2, 0].min() <= -1 / CLOSURE_SATURATE

    assert all(closed(with_words, f) for f in at), [float(with_words[f - 1 : f + 2, 0].min()) for f in at]
    assert sum(closed(heard, f) for f in at) < len(at)  # (the p of "please")


@needs_sphinx
def test_unknown_words_or_a_stream_fall_back_to_the_phones_heard_with_one_line(tmp_path):
    text = tmp_path / "t.txt"
    text.write_text("Buenos días, ¿qué tal? Me llamo Pedro y vivo en Barcelona, cerca del mar. Hasta luego.")
    cfg = load_config(None, ("video.width=64", "video.height=64", f"preview.transcript={text}"))
    static = build_preview(cfg).prepare(request_input(cfg, load_reference(FACE), FACE, audio=TALK))
    assert static.script is None and len(static.notes) == 1  # (5 of its 16 words are not in the dictionary)
    assert "('cerca', 'días', 'llamo', 'luego', 'qué')" in static.notes[0] and "phones heard" in static.notes[0]
    static = build_preview(cfg).prepare(request_input(cfg, load_reference(FACE), FACE))  # (no audio file: a stream)
    assert static.script is None and len(static.notes) == 1 and "stream" in static.notes[0]
    text.write_text("The quick brown fox jumps over the lazy dog. " * 3)  # not what talk.wav says
    static = build_preview(cfg).prepare(request_input(cfg, load_reference(FACE), FACE, audio=TALK))
    assert static.script is None and "could not be aligned" in static.notes[0]


def test_a_render_started_with_other_words_is_not_resumed(tmp_path):
    """The journal records the transcript's content (as the reference's and the audio's): a resume after the
    words were edited would mix two scripts' mouths, and is refused."""
    from avatar_render.job.journal import Journal, identity

    words = tmp_path / "words.txt"
    words.write_text("Good morning, and welcome.")
    config = {"preview": {"transcript": str(words)}}
    started = SimpleNamespace(meta={"identity": identity(config, FACE, TALK)})
    assert Journal.mismatch(started, identity(config, FACE, TALK)) is None
    words.write_text("Good evening, and welcome.")
    assert Journal.mismatch(started, identity(config, FACE, TALK)) == (
        "the transcript 'words.txt' is not the file it was started with")
    plain = SimpleNamespace(meta={"identity": identity({"preview": {"transcript": None}}, FACE, TALK)})
    assert Journal.mismatch(plain, identity({"preview": {"transcript": None}}, FACE, TALK)) is None


@needs_sphinx
def test_the_set_up_aligns_the_first_stretch_and_the_chunks_the_rest_as_they_reach_them(tmp_path, monkeypatch):
    """A long recording's words are not all aligned before its first frame: the set-up aligns the first stretch
    of speech, each chunk's window what it reaches; the phones are those of the whole file aligned at once."""
    audio, text = tmp_path / "long.wav", tmp_path / "long.txt"
    with wave.open(str(TALK)) as w:
        params, data = w.getparams(), w.readframes(w.getnframes())
    with wave.open(str(audio), "wb") as w:
        w.setparams(params)
        w.writeframes(data * 2)
    text.write_text((talk_text() + "\n") * 2)
    aligned = []
    real = script_module._aligned_phones
    monkeypatch.setattr(script_module, "_aligned_phones", lambda *a: aligned.append(a[2]) or real(*a))
    cfg = load_config(None, ("video.width=64", "video.height=64", f"preview.transcript={text}"))
    pipe = build_preview(cfg)

    def prepared():
        static = pipe.prepare(request_input(cfg, load_reference(FACE), FACE, audio=audio))
        assert static.script is not None and static.notes == ()
        return static.script

    script = prepared()
    assert len(aligned) == 1 and script.stretches_aligned == 1  # (talk.wav alone has some 10 stretches)
    starts = np.arange(0.0, 4.0, 2.0)
    chunks = [script.window(t - 0.32, t + 2.32) for t in starts]
    assert 1 < script.stretches_aligned < 6
    whole = prepared()
    assert whole.window(0.0, 1e9) is not None and whole.stretches_aligned > 15
    assert chunks == [whole.window(t - 0.32, t + 2.32) for t in starts]
    resumed = prepared()  # a render resumed at 30 s: its first window's stretches only, then on from there
    assert resumed.window(29.68, 32.32) == whole.window(29.68, 32.32) and resumed.stretches_aligned < 5
    assert resumed.window(31.68, 34.32) == whole.window(31.68, 34.32)


@needs_sphinx
def test_a_later_stretch_that_does_not_align_hands_the_rest_to_the_recogniser(tmp_path, monkeypatch):
    text = tmp_path / "talk.txt"
    text.write_text(talk_text())
    real = script_module._aligned_phones
    texts: list[str] = []  # the words of each stretch asked for (a stretch is tried with several settings)

    def third_fails(decoder, pcm, words):
        texts.extend([words] if words not in texts else [])
        return None if texts.index(words) == 2 else real(decoder, pcm, words)

    monkeypatch.setattr(script_module, "_aligned_phones", third_fails)
    cfg = load_config(None, ("video.width=64", "video.height=64", f"preview.transcript={text}"))
    pipe = build_preview(cfg)
    static = pipe.prepare(request_input(cfg, load_reference(FACE), FACE, audio=TALK))
    script = static.script
    assert script is not None and script.window(-0.32, 0.5) is not None
    spans = script._aligner.spans  # [first, end) 10-ms frames of each stretch
    lost = spans[2][0] * 0.01
    assert script.window(lost - 1.0, lost) is not None  # (ends before the third stretch: its phones)
    assert script.window(lost - 1.0, lost + 0.5) is None and script.window(lost + 1.0, lost + 2.0) is None
    context = next(s for s in pipe.generate if isinstance(s, SpeechContext))
    heard = whole_file_targets(dataclasses.replace(static, script=None), context)
    assert np.array_equal(whole_file_targets(static, context), heard)  # (the window reaches the third stretch)


@needs_sphinx
@pytest.mark.slow
def test_a_render_with_the_words_stopped_and_resumed_is_the_uninterrupted_one(tmp_path, monkeypatch):
    """The resumed run aligns the first stretch, then from its first window on (not the stretches before):
    its file is the uninterrupted render's, byte for byte."""
    from avatar_render.api import RenderRequest, render
    from avatar_render.job.stop import RenderStopped

    text = tmp_path / "talk.txt"
    text.write_text(talk_text())
    cfg = load_config(None, ("video.width=64", "video.height=64", f"preview.transcript={text}"))

    def run(name: str, should_stop=None, **kw):
        return render(RenderRequest(reference=FACE, audio=TALK, output=tmp_path / name, config=cfg, **kw),
                      should_stop=should_stop, on_message=lambda level, text: None)

    aligned: list[str] = []  # the words of each stretch aligned (several times where one setting fails)
    real = script_module._aligned_phones
    monkeypatch.setattr(script_module, "_aligned_phones", lambda *a: aligned.append(a[2]) or real(*a))
    run("whole.mp4")
    whole, aligned[:] = set(aligned), []
    calls = [0]

    def after_chunks() -> bool:  # asked once before the loop, then after every chunk-plan entry
        calls[0] += 1
        return calls[0] > 4

    with pytest.raises(RenderStopped):
        run("b.mp4", should_stop=after_chunks)
    aligned[:] = []
    report = run("b.mp4", resume=True)
    assert report.resumed_frames > 0
    assert (tmp_path / "b.mp4").read_bytes() == (tmp_path / "whole.mp4").read_bytes()
    assert set(aligned) < whole  # (the stretches wholly before the resumed run's first window are not aligned)


@needs_sphinx
def test_a_transcript_far_too_short_or_long_for_the_speech_falls_back_with_one_line():
    """Three words for 25 s of speech (or the text many times over) cannot be what was said: every stretch
    after the first would get no words and the mouth would stay shut; the recogniser is used, and says so."""
    for text in ("Hola, buenos dias.", " ".join([talk_text()] * 4)):
        script, note = align_script(TALK, text)
        assert script is None and "not the words spoken" in note, note
    script, note = align_script(TALK, talk_text())
    assert script is not None and note == ""
    script.close()


@needs_sphinx
def test_the_aligner_holds_the_transcripts_words_not_the_whole_dictionary():
    """Each of the aligner's decoders knows the transcript's words alone: with PocketSphinx's whole dictionary
    and its default language model each cost some 90 MB (a render with the words peaked at 320-430 MB for 230)."""
    code = (
        "import re, sys\n"
        "from pathlib import Path\n"
        "from avatar_render.preview import script\n"
        "def peak():  # MB (this process image's own: ru_maxrss keeps the parent's across exec)\n"
        "    return int(re.search(r'VmHWM:\\s+(\\d+)', Path('/proc/self/status').read_text()).group(1)) // 1024\n"
        "before = peak()\n"
        "s, why = script.align_script(Path(sys.argv[1]), Path(sys.argv[2]).read_text())\n"
        "assert s is not None and s.window(0.0, 1e9) is not None, why\n"
        "print(peak() - before)\n"
    )
    done = subprocess.run([sys.executable, "-c", code, str(TALK), str(ROOT / "examples" / "talk.txt")],
                          capture_output=True, text=True, check=True)
    assert int(done.stdout.split()[-1]) < 40  # MB


def test_numbers_and_signs_are_written_out_as_spoken():
    assert [w for w, _ in words_of("Platform 4 at 10:30, in 1984: the 3rd of $20, or 5% & 1,200.")] == (
        "platform four at ten thirty in nineteen eighty four the third of twenty dollars or five percent and one "
        "thousand two hundred").split()
    assert [w for w, _ in words_of("Open at 9:00, 9:05 and 10am; $1, 2.5 and 2005.")] == (
        "open at nine o'clock nine oh five and ten am one dollar two point five and two thousand and five").split()
    assert guess_phones("bumble") == "B AH M B L" and guess_phones("qué") == "K W EH" and guess_phones("北京") is None
    # a phone number digit by digit; numbers past what num2words can say (it raised) as digits too
    assert [w for w, _ in words_of("Call 5551234. Or 5551234567.")] == (
        "call five million five hundred and fifty one thousand two hundred and thirty four or five five five one two "
        "three four five six seven").split()
    assert set(w for w, _ in words_of("9" * 5000 + "th, " + "1." + "1" * 400)) == {"nine", "one", "point"}


def _all_phones(text: str) -> tuple[Phone, ...]:
    script, note = align_script(TALK, text)
    assert script is not None, note
    assert script.window(0.0, 1e9) is not None  # (every stretch aligned)
    script.close()
    return script.phones


@needs_sphinx
def test_a_transcript_with_digits_is_aligned_as_with_the_words():
    """A script's numbers were words the dictionary lacked: the whole transcript fell back to the recogniser."""
    text = talk_text()
    assert _all_phones(text.replace("nine", "9").replace("eight", "8")) == _all_phones(text)


@needs_sphinx
def test_a_name_the_dictionary_lacks_gets_phones_from_its_letters_and_one_line(monkeypatch):
    """'library' taken out of the dictionary, as a name would be: guessed from its letters (L IH B R AA R IY),
    the words around it keep theirs, and its b still closes the lips where the dictionary's b is. (Another
    language's words, more than a tenth of them, still fall back: ``test_unknown_words_or_a_stream_...``.)"""
    from avatar_render.preview import script as sc

    b_of_library = [p for p in _all_phones(talk_text()) if p.label == "B"][0]
    spellings = sc._spellings
    monkeypatch.setattr(sc, "_spellings", lambda words: [e for e in spellings(words) if not e[0].startswith("library")])
    script, note = align_script(TALK, talk_text())
    assert script is not None and "'library'" in note and "guessed from their letters" in note, note
    script.close()
    guessed = [p for p in _all_phones(talk_text()) if p.label == "B"][0]
    assert abs((guessed.start + guessed.end) / 2 - (b_of_library.start + b_of_library.end) / 2) < 0.06


def test_subtitles_written_by_hand_are_read_for_their_words():
    """Timings without milliseconds, with fewer digits or no spaces round the arrow: still timings, not words."""
    srt = ("1\n00:00:01 --> 00:00:03\nGood morning.\n\n2\n0:00:03.5-->0:00:06.25\nWe open at nine.\n\n"
           "3\n00:06,0 --> 00:08,0\nWelcome.\n")
    assert [w for w, _ in words_of(srt)] == "good morning we open at nine welcome".split()


@needs_sphinx
def test_subtitles_are_read_for_their_words():
    """An .srt or .vtt of the speech: its cue numbers, timings, headers and tags were words (and numbers)."""
    sentences = [s.strip() + "." for s in talk_text().split(".") if s.strip()]
    srt = "".join(f"{i + 1}\n00:00:{2 * i:02d},000 --> 00:00:{2 * i + 2:02d},000\n<i>{s}</i>\n\n"
                  for i, s in enumerate(sentences))
    vtt = "WEBVTT\nKind: captions\n\n" + "".join(f"cue{i}\n00:{2 * i:02d}.000 --> 00:{2 * i + 2:02d}.000 align:start\n"
                                                 f"<v Guide>{s}</v>\n\n" for i, s in enumerate(sentences))
    plain = [w for w, _ in words_of(talk_text())]
    assert [w for w, _ in words_of(srt)] == plain and [w for w, _ in words_of(vtt)] == plain
    lips = [p.label for p in _all_phones(talk_text()) if p.label in LIPS]
    assert [p.label for p in _all_phones(srt) if p.label in LIPS] == lips
