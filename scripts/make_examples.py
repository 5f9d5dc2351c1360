"""Re-create examples/face.png and examples/talk.wav, or (--extra DIR) the recordings the preview is measured on.

face.png is scikit-image's copy of NASA's public-domain astronaut portrait (Eileen Collins);
talk.wav is a paragraph spoken by the espeak-ng synthesizer. Needs ``pip install scikit-image``
and the ``espeak-ng`` program (Debian/Ubuntu: ``apt-get install espeak-ng``).

The extra recordings (espeak-ng too, each with its text in NAME.txt): ``voice2.wav`` another voice
(British English, female variant, faster), ``spanish.wav`` another language, ``mbp.wav`` English rich
in m/b/p, ``eeoo.wav`` "see" and "sue" five times each, alternating, and two held-out m/b/p checks:
``mbp_f3.wav`` (the same text, another voice) and ``mbp_text2.wav`` (another text and voice). And one
human voice: ``librivox.wav``, five sentences of a LibriVox reading (public domain) that PocketSphinx's
source distribution carries as test data, with their transcripts, joined with half-second pauses (taken
from the ``pocketsphinx`` sdist on PyPI by ``pip download``; skipped, with a message, where pip cannot
get it). scripts/measure_preview.py uses them.

    python scripts/make_examples.py [--out examples]
    python scripts/make_examples.py --extra DIR
"""

from __future__ import annotations

import argparse
import importlib.metadata
import io
import shutil
import subprocess
import sys
import tarfile
import tempfile
import wave
from pathlib import Path

TEXT = (
    "Good morning, and welcome to the city library. "
    "We open at nine o'clock every day, and we close at eight in the evening. "
    "On the ground floor you will find newspapers, magazines, and a quiet reading room. "
    "The children's books are upstairs, next to the study rooms. "
    "If you have a question, please ask at the front desk. "
    "Thank you for listening, and have a pleasant day."
)
VOICE = "en-us"
WORDS_PER_MINUTE = 150
SENTENCE_GAP_MS = 400  # extra silence after each sentence


def make_face(out: Path) -> None:
    try:
        import skimage.data
    except ImportError:
        sys.exit("scikit-image is needed for face.png: pip install scikit-image")
    bundled = Path(skimage.data.__file__).with_name("astronaut.png")
    if bundled.is_file():
        shutil.copyfile(bundled, out)  # byte-for-byte
    else:  # newer releases may only hand out the pixels
        from PIL import Image

        Image.fromarray(skimage.data.astronaut()).save(out)


# name: (voice, words per minute, text)
EXTRA = {
    "voice2": ("en-gb+f3", 170, "The train to the coast leaves from platform four at half past ten. "
               "Remember to bring a warm coat, because the weather by the sea changes quickly. "
               "We will stop for lunch in a small village, and walk along the cliffs in the afternoon."),
    "spanish": ("es", 150, "Buenos días a todos. Hoy vamos a hablar de la ciudad y de sus museos. "
                "El museo principal abre a las diez de la mañana y cierra a las ocho de la tarde. "
                "Por favor, pregunten en la entrada si necesitan ayuda."),
    "mbp": ("en-us", 140, "Bob bought a big map. Pam made my mom a pumpkin pie. "
            "Maybe the boy put the blue cup by the pool. Mike and Bob passed the ball to Paul."),
    "eeoo": ("en-us", 120, "see. sue. see. sue. see. sue. see. sue. see. sue."),
    # m/b/p closures on voices and a text the preview was not tuned on
    "mbp_f3": ("en-gb+f3", 170, "Bob bought a big map. Pam made my mom a pumpkin pie. "
               "Maybe the boy put the blue cup by the pool. Mike and Bob passed the ball to Paul."),
    "mbp_text2": ("en+f4", 160, "My mother baked a plum pie for the big picnic. Please bring the map and a warm "
                  "blanket. Bill bumped the lamp by the bed."),
}


def speak(out: Path, text: str, *, voice: str, wpm: int) -> float:
    espeak = shutil.which("espeak-ng")
    if espeak is None:
        sys.exit(f"The espeak-ng program is needed for {out.name}: install it (apt-get install espeak-ng).")
    # SSML breaks lengthen the pauses between sentences.
    sentences = [s.strip().rstrip(".") for s in text.split(". ")]
    ssml = "<speak>" + "".join(f'{s}. <break time="{SENTENCE_GAP_MS}ms"/> ' for s in sentences) + "</speak>"
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "speech.wav"
        subprocess.run([espeak, "-m", "-v", voice, "-s", str(wpm), "-w", str(raw), ssml], check=True)
        with wave.open(str(raw)) as wav:
            assert wav.getnchannels() == 1 and wav.getsampwidth() == 2, "espeak-ng should write 16-bit mono"
            seconds = wav.getnframes() / wav.getframerate()
        shutil.copyfile(raw, out)
    return seconds


def make_speech(out: Path) -> None:
    seconds = speak(out, TEXT, voice=VOICE, wpm=WORDS_PER_MINUTE)
    print(f"{out}: {seconds:.1f} s at {VOICE}, {WORDS_PER_MINUTE} words per minute")


def make_extra(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, (voice, wpm, text) in EXTRA.items():
        seconds = speak(folder / f"{name}.wav", text, voice=voice, wpm=wpm)
        (folder / f"{name}.txt").write_text(text + "\n")
        print(f"{folder / name}.wav: {seconds:.1f} s, voice {voice}, {wpm} words per minute")
    make_librivox(folder / "librivox.wav")


def make_librivox(out: Path) -> None:
    """The LibriVox sentences of PocketSphinx's test data (16 kHz mono), one after the other, and their text."""
    try:
        version = importlib.metadata.version("pocketsphinx")
    except importlib.metadata.PackageNotFoundError:
        print(f"{out.name} skipped: pocketsphinx is not installed (its version names the sdist)")
        return
    with tempfile.TemporaryDirectory() as tmp:
        got = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
                              "-d", tmp, f"pocketsphinx=={version}"], capture_output=True, text=True)
        sdists = list(Path(tmp).glob("pocketsphinx-*.tar.gz"))
        if got.returncode != 0 or not sdists:
            print(f"{out.name} skipped: pip could not download the pocketsphinx {version} sdist")
            return
        pcm, texts = [], []
        with tarfile.open(sdists[0]) as tar:
            wavs = sorted(m for m in tar.getnames() if "/test/data/librivox/" in m and m.endswith(".wav"))
            for name in wavs:
                with wave.open(io.BytesIO(tar.extractfile(name).read())) as w:
                    assert (w.getframerate(), w.getnchannels(), w.getsampwidth()) == (16000, 1, 2), name
                    pcm += [w.readframes(w.getnframes()), bytes(2 * 8000)]  # and half a second of silence
                texts.append(tar.extractfile(name[:-4] + ".txt").read().decode().strip())
    if not wavs:
        print(f"{out.name} skipped: the pocketsphinx {version} sdist has no LibriVox test data")
        return
    with wave.open(str(out), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(b"".join(pcm))
    out.with_suffix(".txt").write_text(". ".join(texts) + ".\n")
    seconds = sum(len(b) for b in pcm) / 32000
    print(f"{out}: {seconds:.1f} s, {len(wavs)} sentences of a LibriVox reading (human voice)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "examples")
    parser.add_argument("--extra", type=Path, default=None, help="write only the extra recordings, into this folder")
    args = parser.parse_args()
    if args.extra is not None:
        make_extra(args.extra)
        return
    args.out.mkdir(parents=True, exist_ok=True)
    make_face(args.out / "face.png")
    print(f"{args.out / 'face.png'}: astronaut portrait")
    make_speech(args.out / "talk.wav")


if __name__ == "__main__":
    main()
