"""Re-create examples/face.png and examples/talk.wav.

face.png is scikit-image's copy of NASA's public-domain astronaut portrait (Eileen Collins);
talk.wav is a paragraph spoken by the espeak-ng synthesizer. Needs ``pip install scikit-image``
and the ``espeak-ng`` program (Debian/Ubuntu: ``apt-get install espeak-ng``).

    python scripts/make_examples.py [--out examples]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
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


def make_speech(out: Path) -> None:
    espeak = shutil.which("espeak-ng")
    if espeak is None:
        sys.exit("The espeak-ng program is needed for talk.wav: install it (apt-get install espeak-ng).")
    # SSML breaks lengthen the pauses between sentences.
    sentences = [s.strip().rstrip(".") for s in TEXT.split(". ")]
    ssml = "<speak>" + "".join(f'{s}. <break time="{SENTENCE_GAP_MS}ms"/> ' for s in sentences) + "</speak>"
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "talk.wav"
        subprocess.run([espeak, "-m", "-v", VOICE, "-s", str(WORDS_PER_MINUTE), "-w", str(raw), ssml], check=True)
        with wave.open(str(raw)) as wav:
            assert wav.getnchannels() == 1 and wav.getsampwidth() == 2, "espeak-ng should write 16-bit mono"
            seconds = wav.getnframes() / wav.getframerate()
        shutil.copyfile(raw, out)
    print(f"{out}: {seconds:.1f} s at {VOICE}, {WORDS_PER_MINUTE} words per minute")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "examples")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    make_face(args.out / "face.png")
    print(f"{args.out / 'face.png'}: astronaut portrait")
    make_speech(args.out / "talk.wav")


if __name__ == "__main__":
    main()
