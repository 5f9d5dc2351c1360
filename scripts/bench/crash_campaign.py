"""Crash campaign: a render killed with SIGKILL at many moments, resumed each time, must end as the
very bytes of the uninterrupted render.

Each trial starts the render, kills it (the whole process group: under torchrun every process) one
to three times - at a random moment of the generation, during the final copy into a regular MP4, or
while the finished file is moved into place - running ``--resume`` after each kill, then lets the
last ``--resume`` finish and compares the MP4 with the uninterrupted render, byte for byte:

    python scripts/bench/crash_campaign.py --trials 20 --seconds 150
    python scripts/bench/crash_campaign.py --trials 5 --seconds 12 --torchrun 2 -c configs/tiny.yaml

It prints one line per trial and ``N of N trials resumed to a byte-identical MP4``; it exits with 1
if any did not.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from avatar_render.bench import loop_speech

ROOT = Path(__file__).resolve().parents[2]
KINDS = ("generation", "copy", "move")

# The CLI, stopped while it copies the finished fragmented file into a regular MP4 (when the copy has
# grown to a random share of the fragmented file's size; should the copy be quicker than the watch,
# right after it, before it is moved into place): it asks the campaign to kill the whole launch
# (creates the file $CAMPAIGN_KILL) and waits. argv[1] is the seed.
KILL_IN_COPY = """
import os, random, sys, threading, time
from pathlib import Path
from avatar_render.job import loop
real, share = loop.remux_faststart, random.Random(int(sys.argv.pop(1))).uniform(0.05, 0.95)
def ask_to_be_killed():
    Path(os.environ["CAMPAIGN_KILL"]).touch()
    time.sleep(3600)
def remux(src, dst):
    target, parts = share * os.path.getsize(src), f".{Path(dst).name}.*.tmp"  # the copy's temporary name
    def size(part):
        try:
            return part.stat().st_size
        except OSError:  # gone between the listing and the look
            return 0
    def watch():
        while not any(size(part) >= target for part in Path(dst).parent.glob(parts)):
            time.sleep(0.0002)
        ask_to_be_killed()
    threading.Thread(target=watch, daemon=True).start()
    real(src, dst)
    ask_to_be_killed()
loop.remux_faststart = remux
from avatar_render.cli import main
sys.argv = ["avatar-render", *sys.argv[1:]]
main()
"""

# The CLI, stopped right after the finished file is linked into place (before the journal's copy is
# removed): it asks the campaign to kill the whole launch and waits.
KILL_IN_MOVE = """
import os, sys, time
from pathlib import Path
from avatar_render.job import loop
def move(src, dst, **kw):
    os.link(src, dst)
    Path(os.environ["CAMPAIGN_KILL"]).touch()
    time.sleep(3600)
loop.move_into_place = move
from avatar_render.cli import main
sys.argv = ["avatar-render", *sys.argv[1:]]
main()
"""


class Campaign:
    def __init__(self, work: Path, args: argparse.Namespace) -> None:
        self.work, self.a = work, args
        self.kill_file = work / "kill-now"
        self.env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "CAMPAIGN_KILL": str(self.kill_file)}
        self.audio = work / "speech.wav"
        loop_speech(args.audio, args.seconds, self.audio)
        self.rng = random.Random(args.seed)

    def command(self, output: Path, *extra: str, driver: str | None = None,
                driver_args: tuple[str, ...] = ()) -> list[str]:
        cli = [*driver_args, "render", "--ref", str(self.a.ref), "--audio", str(self.audio), "-o", str(output), "-q",
               *extra]
        if self.a.config:
            cli += ["-c", str(self.a.config)]
        cli += self.a.overrides
        if driver is not None:
            script = self.work / "driver.py"
            script.write_text(driver)
            target = [str(script)]
        else:
            target = ["-m", "avatar_render"]
        if self.a.torchrun:
            launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                        str(self.a.torchrun), f"--log-dir={os.devnull}"]
            return [*launcher, *(target if driver else ["-m", "avatar_render"]), *cli]
        return [sys.executable, *target, *cli]

    def start(self, cmd: list[str]) -> subprocess.Popen:
        return subprocess.Popen(cmd, cwd=self.work, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True)  # a session of its own (kill_tree ends all of it)

    def run(self, cmd: list[str]) -> subprocess.CompletedProcess:
        return subprocess.run(cmd, cwd=self.work, env=self.env, capture_output=True, text=True)

    def reference(self) -> tuple[str, float]:
        out = self.work / "reference.mp4"
        t = time.monotonic()
        done = self.run(self.command(out))
        if done.returncode:
            sys.exit(f"the uninterrupted render failed: {done.stderr.strip()}")
        self.size = out.stat().st_size
        return sha256(out), time.monotonic() - t

    def kill_once(self, output: Path, kind: str, resume: bool) -> str:
        """Start (or resume) the render, kill it as ``kind`` says; what happened, in words."""
        extra = ("--resume",) if resume else ()
        journal = output.with_name(output.name + ".journal")
        if kind in ("move", "copy"):
            driver, args = (KILL_IN_MOVE, ()) if kind == "move" else (KILL_IN_COPY, (str(self.rng.randrange(2**31)),))
            self.kill_file.unlink(missing_ok=True)
            proc = self.start(self.command(output, *extra, driver=driver, driver_args=args))
            while proc.poll() is None and not self.kill_file.exists():
                time.sleep(0.001)
            landed = proc.poll() is None
            kill_tree(proc.pid)
            proc.wait()
            where = "while moving into place" if kind == "move" else "during the final copy"
            if not landed:
                return (f"{kind}: ended before the kill (exit {proc.returncode}) "
                        f"{proc.stderr.read().decode().strip()[-300:]}")
            return f"killed {where} ({committed(journal)} frames committed)"
        # Generation: killed at a random point of the video, when the partial file has grown to that
        # share of the finished one's size (whatever the machine's load).
        partial = output.with_name(output.stem + ".partial.mp4")
        have = partial.stat().st_size if partial.exists() else 0
        target = self.rng.uniform(max(0.05, have / self.size), 0.97) * self.size
        proc = self.start(self.command(output, *extra))
        while proc.poll() is None and (not partial.exists() or partial.stat().st_size < target):
            time.sleep(0.002)
        alive = proc.poll() is None
        if alive:
            kill_tree(proc.pid)
        proc.wait()
        if not alive:
            return f"{kind}: finished before the kill (exit {proc.returncode})"
        return f"killed during {kind} ({committed(journal)} frames committed)"

    def trial(self, i: int, want: str) -> bool:
        output = self.work / f"trial{i}.mp4"
        journal = output.with_name(output.name + ".journal")
        events = []
        for k in range(self.rng.randint(1, 3)):
            kind = want if k == 0 else self.rng.choice(KINDS)
            events.append(self.kill_once(output, kind, resume=k > 0))
            if kind == "move" or (output.exists() and not journal.exists()):  # nothing left to interrupt
                break
        self.kills += sum(e.startswith("killed") for e in events)
        finished = output.exists() and not journal.exists()  # a resume ran to its end before the next kill
        done = (self.run(self.command(output, "--resume")) if not finished
                else subprocess.CompletedProcess([], 0, "", ""))
        same = done.returncode == 0 and output.is_file() and sha256(output) == self.expected
        leftovers = [p.name for p in self.work.glob(f"trial{i}.*") if p.name != output.name]
        verdict = ("byte-identical" if same and not leftovers
                   else f"DIFFERENT (exit {done.returncode}, leftovers {leftovers}) {done.stderr.strip()}")
        print(f"trial {i + 1:2d}: " + "; ".join(events) + f"; resumed: {verdict}", flush=True)
        output.unlink(missing_ok=True)
        return same and not leftovers

    def go(self) -> int:
        self.expected, duration = self.reference()
        print(f"uninterrupted render: {duration:.1f} s, sha256 {self.expected[:16]}...", flush=True)
        kinds = [("generation", "copy", "generation", "move", "generation")[j % 5] for j in range(self.a.trials)]
        self.kills = 0
        matched = sum(self.trial(i, kind) for i, kind in enumerate(kinds))
        print(f"{matched} of {self.a.trials} trials ({self.kills} kills in all) resumed to a byte-identical MP4")
        return 0 if matched == self.a.trials else 1


def kill_tree(pid: int) -> None:
    """SIGKILL to ``pid`` and every process below it (torchrun's workers run in sessions of their own, so
    a process group is not enough): as a machine going down, or a scheduler ending the job, would."""
    tree, todo = [], [pid]
    while todo:
        p = todo.pop()
        tree.append(p)
        for task in Path(f"/proc/{p}/task").glob("*"):
            try:
                todo += [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                pass
    for p in tree:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass


def committed(journal: Path) -> int:
    """Frames the journal's last commit holds (0 when there is none yet)."""
    try:
        return int(json.loads((journal / "journal.json").read_text())["commit"]["frames"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--seconds", type=float, default=150.0, help="length of the audio (examples/talk.wav repeated)")
    ap.add_argument("--ref", type=Path, default=ROOT / "examples" / "face.png")
    ap.add_argument("--audio", type=Path, default=ROOT / "examples" / "talk.wav", help="a WAV file")
    ap.add_argument("-c", "--config", type=Path)
    ap.add_argument("--torchrun", type=int, default=0, help="processes of a torchrun launch (0: one process)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--keep", action="store_true", help="keep the work folder")
    ap.add_argument("overrides", nargs="*", help="config overrides, key=value")
    a = ap.parse_args()
    a.ref, a.audio = a.ref.resolve(), a.audio.resolve()
    a.config = a.config.resolve() if a.config else None
    work = Path(tempfile.mkdtemp(prefix="crash-campaign-"))
    try:
        code = Campaign(work, a).go()
    finally:
        if a.keep:
            print(f"work folder kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    sys.exit(code)


if __name__ == "__main__":
    main()
