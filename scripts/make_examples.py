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

And photos that are not the example, taken the same way from test data in PyPI sdists (skipped, with a
message, where pip cannot get them; never committed): from ``face_recognition`` 1.3.0,
``biden.jpg`` (an older face, closed mouth), ``obama.jpg`` (a smile with teeth), ``obama3.jpg`` (a
small face in a tall portrait); and ``glasses.jpg``: biden.jpg with dark spectacle frames drawn over its eyes (placed
by the face landmark model; skipped without it). scripts/preview_references.py renders and measures them.

    python scripts/make_examples.py [--out examples]
    python scripts/make_examples.py --extra DIR
    python scripts/make_examples.py --faces DIR      (only the photos)
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
    make_faces(folder)


# (sdist, member suffix, file written)
FACES = (
    ("face_recognition==1.3.0", "/tests/test_images/biden.jpg", "biden.jpg"),
    ("face_recognition==1.3.0", "/tests/test_images/obama.jpg", "obama.jpg"),
    ("face_recognition==1.3.0", "/tests/test_images/obama3.jpg", "obama3.jpg"),
)


def make_faces(folder: Path) -> None:
    """The test photos of FACES out of their sdists, and glasses.jpg drawn on biden.jpg."""
    with tempfile.TemporaryDirectory() as tmp:
        for spec in dict.fromkeys(f[0] for f in FACES):
            got = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
                                  "--no-build-isolation", "-d", tmp, spec], capture_output=True, text=True)
            name = spec.split("==")[0]
            sdists = [p for p in Path(tmp).glob("*.tar.gz") if p.name.lower().startswith(name.lower())]
            if got.returncode != 0 and not sdists:
                print(f"{name} photos skipped: pip could not download the {spec} sdist")
                continue
            with tarfile.open(sdists[0]) as tar:
                for want, suffix, out in FACES:
                    member = next((m for m in tar.getnames() if m.endswith(suffix)), None) if want == spec else None
                    if member is not None:
                        (folder / out).write_bytes(tar.extractfile(member).read())
                        print(f"{folder / out}: from the {spec} sdist")
    if (folder / "biden.jpg").is_file():
        draw_glasses(folder / "biden.jpg", folder / "glasses.jpg")


def draw_glasses(src: Path, out: Path) -> None:
    """Dark spectacle frames (two rims and a bridge) over the eyes of the face in src, placed by its landmarks."""
    import cv2

    from avatar_render.face import mesh as fm
    from avatar_render.face.detect import FaceDetector, find_face
    from avatar_render.face.landmarks import LandmarkModel, find_model

    path = find_model()
    image = cv2.cvtColor(cv2.imread(str(src)), cv2.COLOR_BGR2RGB)
    layout = find_face(image, FaceDetector(), None)
    mesh = LandmarkModel(path).from_box(image, layout.face) if path is not None and layout is not None else None
    if mesh is None:
        print(f"{out.name} skipped: no face landmark model (python scripts/fetch_face_model.py) or no face found")
        return
    eyes = [mesh.at(fm.LEFT_EYE_UPPER + fm.LEFT_EYE_LOWER), mesh.at(fm.RIGHT_EYE_UPPER + fm.RIGHT_EYE_LOWER)]
    dist = mesh.eye_distance
    thick = max(2, round(0.025 * dist))
    inner = []
    for eye in eyes:
        c = eye.mean(axis=0)
        axes = (round(0.42 * dist), round(0.3 * dist))
        centre = (round(c[0]), round(c[1] + 0.05 * dist))
        cv2.ellipse(image, centre, axes, 0, 0, 360, (25, 22, 20), thick, cv2.LINE_AA)
        inner.append(centre)
    (lx, ly), (rx, ry) = sorted(inner)
    a, b = (lx + round(0.42 * dist), ly - round(0.05 * dist)), (rx - round(0.42 * dist), ry - round(0.05 * dist))
    cv2.line(image, a, b, (25, 22, 20), thick, cv2.LINE_AA)
    cv2.imwrite(str(out), cv2.cvtColor(image, cv2.COLOR_RGB2BGR), [cv2.IMWRITE_JPEG_QUALITY, 92])
    print(f"{out}: {src.name} with spectacle frames drawn on")


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
    parser.add_argument("--faces", type=Path, default=None, help="write only the extra photos, into this folder")
    args = parser.parse_args()
    if args.extra is not None:
        make_extra(args.extra)
        return
    if args.faces is not None:
        args.faces.mkdir(parents=True, exist_ok=True)
        make_faces(args.faces)
        return
    args.out.mkdir(parents=True, exist_ok=True)
    make_face(args.out / "face.png")
    print(f"{args.out / 'face.png'}: astronaut portrait")
    make_speech(args.out / "talk.wav")


if __name__ == "__main__":
    main()
