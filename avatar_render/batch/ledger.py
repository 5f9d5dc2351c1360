"""The batch ledger: one small JSON record per job in ``OUT/.batch/ledger/``, saying what its output was
rendered from (the config and the size and SHA-256 of both inputs) and the size and modification time
of the output it left. A later run skips a job whose record matches and whose output is untouched.

One file per job (written to a temporary name, then renamed), so the processes of a Slurm array or a
Ray driver never write the same file. ``.batch/`` is the batch's own folder, known by its marker file:
a folder of that name without it is somebody else's and is refused.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from omegaconf import OmegaConf

from avatar_render.batch.jobs import Job
from avatar_render.config import Config
from avatar_render.errors import AvatarRenderError
from avatar_render.files.names import os_reason, shown
from avatar_render.files.read import read_json
from avatar_render.files.write import create_new, make_folder, replace_atomically

NEUTRAL_KEYS = (("run", "queue_chunks"), ("run", "no_face"))  # config keys that cannot change the frames
_BLOCK = 1 << 20
_RECORD_LIMIT = 1 << 20
MARKER = ".avatar-render-batch"


def batch_dir(out_dir: Path) -> Path:
    """The batch's own files: ledger, job reports and logs, thumbnails."""
    return Path(out_dir) / ".batch"


def own_batch_dir(out_dir: Path) -> Path:
    """``OUT/.batch``, made now with its marker, or checked to be ours (a folder of an earlier version,
    with a ``ledger`` folder and no marker, gets the marker)."""
    folder = batch_dir(out_dir)
    try:
        if make_folder(folder) or (folder / "ledger").is_dir() and not (folder / MARKER).exists():
            create_new(folder / MARKER).close()
    except OSError as e:
        raise AvatarRenderError(f"Cannot create the batch's folder {shown(folder)}: {os_reason(e)}.") from None
    marker = folder / MARKER
    if folder.is_symlink() or marker.is_symlink() or not marker.is_file():
        raise AvatarRenderError(f"{shown(folder)} is in the way of the batch's own folder and was not made by it; "
                                "move it away.")
    return folder


def own_folder(folder: Path) -> Path:
    """A folder inside the batch's own folder (ledger, reports, logs, thumbnails), made if missing."""
    try:
        make_folder(folder)
    except OSError as e:
        raise AvatarRenderError(f"Cannot create the batch's folder {shown(folder)}: {os_reason(e)}.") from None
    return folder


def file_stat(path: Path) -> dict[str, int]:
    st = path.stat()
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns}


def fingerprint(path: Path, known: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """Size, modification time and SHA-256 of a file; the hash of ``known`` is reused while size and
    time are unchanged (as make and rsync trust them), so a second run does not read every input again."""
    stat = file_stat(path)
    if known and {k: known.get(k) for k in stat} == stat and known.get("sha256"):
        return {**stat, "sha256": known["sha256"]}
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(_BLOCK), b""):
            digest.update(block)
    return {**stat, "sha256": digest.hexdigest()}


def config_digest(cfg: Config) -> str:
    tree = OmegaConf.to_container(OmegaConf.structured(cfg))
    for section, key in NEUTRAL_KEYS:
        tree.get(section, {}).pop(key, None)
    return hashlib.sha256(json.dumps(tree, sort_keys=True).encode()).hexdigest()


def identity(
    config: str, reference: dict[str, Any], audio: dict[str, Any], words: Optional[dict[str, Any]] = None
) -> str:
    """What decides an output's content: the config and the inputs' content (not their names or times), the
    transcript's (``words``: ``preview.transcript``'s fingerprint) when there is one."""
    parts = {
        "config": config,
        "reference": [reference["size"], reference["sha256"]],
        "audio": [audio["size"], audio["sha256"]],
    }
    if words is not None:
        parts["words"] = [words["size"], words["sha256"]]
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


@dataclass(frozen=True)
class Decision:
    action: str  # skip | render | refuse
    reason: str = ""  # for skip and refuse
    force: bool = False  # replace the output / discard a partial render


class Ledger:
    def __init__(self, out_dir: Path) -> None:
        self.dir = batch_dir(out_dir) / "ledger"

    def _path(self, job: Job) -> Path:
        return self.dir / f"{job.key}.json"

    def get(self, job: Job) -> Optional[dict[str, Any]]:
        path = self._path(job)
        if not path.exists():
            return None
        try:  # a damaged record (cut short, nested too deep, not a file) is as good as none
            record = read_json(path, what="ledger record", give="a record this batch wrote", limit=_RECORD_LIMIT)
        except AvatarRenderError:
            return None
        return record if isinstance(record, dict) and record.get("name") == job.name else None

    def put(self, job: Job, **record: Any) -> None:
        path = self._path(job)
        data = {
            "name": job.name,
            "output": str(job.output),
            "reference": str(job.reference),
            "audio": str(job.audio),
            "updated": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            **record,
        }
        try:
            make_folder(self.dir)
            replace_atomically(path, (json.dumps(data, indent=1) + "\n").encode())
        except OSError as e:
            raise AvatarRenderError(f"Cannot write the batch ledger '{path}': {e.strerror or e}.") from None

    def decide(self, job: Job, ident: str, *, partial_exists: bool, force: bool) -> Decision:
        """Skip a finished job, refuse to replace what is not this batch's, otherwise render (resuming
        a partial render the worker finds in the job's journal)."""
        if force:
            return Decision("render", force=True)
        record = self.get(job) or {}
        if job.output.exists():
            if record.get("status") != "done":
                return Decision(
                    "refuse",
                    f"'{job.output_name}' already exists and was not rendered by this batch; "
                    "pass --force to replace it.",
                )
            if record.get("identity") != ident:
                return Decision(
                    "refuse",
                    f"'{job.output_name}' was rendered from other inputs or another config; "
                    "pass --force to render it again.",
                )
            if record.get("output_stat") != file_stat(job.output):
                return Decision(
                    "refuse",
                    f"'{job.output_name}' was changed after this batch rendered it; pass --force to render it again.",
                )
            return Decision("skip", "complete, with the same inputs and config")
        if partial_exists and record.get("identity") not in (None, ident):
            return Decision(
                "refuse",
                f"a partial render of '{job.output_name}' from other inputs or another config is in the "
                "way; pass --force to start it over.",
            )
        return Decision("render")
