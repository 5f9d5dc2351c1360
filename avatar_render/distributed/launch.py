"""Process-group setup and teardown for one request across the processes of a ``torchrun`` launch.

An error on any process must end every process quickly with one message: a process blocked in a
collective never sees a peer's exception. So each process watches a key in the launcher's store from
a thread. The first process to fail claims the key and reports its error; every other process that
sees the key (or fails later) exits at once with status 1 and prints nothing.
"""

from __future__ import annotations

import atexit
import dataclasses
import hashlib
import json
import os
import sys
import threading
import time
from contextlib import contextmanager
from datetime import timedelta
from typing import TYPE_CHECKING, Callable, Iterator, Optional

from avatar_render.distributed.device_mesh import Launch, Mesh, build_mesh, pick_device, single
from avatar_render.distributed.numa import Affinity, describe, gpu_bus_id, pin_near
from avatar_render.errors import AvatarRenderError

if TYPE_CHECKING:
    import torch.distributed as dist

ABORT_KEY = "avatar_render/abort"
POLL_S = 0.1  # how often each process looks for a peer's failure
REPORT_WAIT_S = 5.0  # the longest a process waits for the failing one to report before it exits
EXIT_GRACE_S = 2.0
PEER_EXIT = 1  # exit status of a process ended because another one failed


def _store(launch: Launch, *, master: bool) -> "dist.TCPStore":
    import torch.distributed as dist

    return dist.TCPStore(launch.master_addr, launch.master_port, launch.world, is_master=master,
                         timeout=timedelta(seconds=60), wait_for_workers=False)


class AbortWatch:
    """A daemon thread that ends this process when another process claims the abort key."""

    def __init__(self, launch: Launch, on_abort: Optional[Callable[[], None]] = None) -> None:
        self.launch = launch
        self.on_abort = on_abort  # best-effort cleanup before this process is ended
        self.key = f"{ABORT_KEY}/{launch.restart}"
        self.stopping = threading.Event()
        self.store = _store(launch, master=False)
        self.thread = threading.Thread(target=self._watch, name="abort-watch", daemon=True)
        self.thread.start()

    def _watch(self) -> None:
        store = _store(self.launch, master=False)  # its own connection: the main thread uses the other
        while not self.stopping.wait(POLL_S):
            try:
                claimed = store.check([self.key]) and store.get(self.key).decode() != str(self.launch.rank)
            except Exception:  # noqa: BLE001 - the store is gone: the launcher is ending the job
                claimed = not self.stopping.is_set()
            if claimed and not self.stopping.is_set():
                self.end(store)

    def end(self, store=None) -> None:
        """Another process failed: clean up, let it report first, exit silently."""
        self.wait_for_report(store)
        if self.on_abort is not None:
            try:
                self.on_abort()
            except Exception:  # noqa: BLE001 - exiting anyway
                pass
        _flush()
        os._exit(PEER_EXIT)

    def wait_for_report(self, store=None) -> None:
        """Let the failing process print its message and exit first (the launcher then blames it)."""
        store = store or self.store
        deadline = time.monotonic() + REPORT_WAIT_S
        while time.monotonic() < deadline:
            try:
                if store.check([self.key + "/reported"]):
                    time.sleep(EXIT_GRACE_S)  # its interpreter is shutting down
                    return
            except Exception:  # noqa: BLE001
                return
            time.sleep(POLL_S / 2)

    def claim(self) -> bool:
        """Mark this process as the one that failed; False when another one did first."""
        mine = str(self.launch.rank).encode()
        try:
            now = self.store.compare_set(self.key, "", mine)
        except Exception:  # noqa: BLE001 - no store: report the error ourselves
            return True
        if bytes(now) != mine:
            return False
        atexit.register(self._reported)  # after the caller has printed the error
        return True

    def _reported(self) -> None:
        _flush()
        try:
            self.store.set(self.key + "/reported", "1")
        except Exception:  # noqa: BLE001
            pass

    def stop(self) -> None:
        self.stopping.set()
        if self.thread is not threading.current_thread():
            self.thread.join()


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001
            pass


# The longest a process waits for the others: in a model collective (all processes run the chunk loop
# in step; a little slack for process 0's writing), and on the control group, where the others wait
# while process 0 alone reads the journal before the chunk loop and finishes the file after it.
COLLECTIVE_TIMEOUT = timedelta(minutes=30)
CONTROL_TIMEOUT = timedelta(hours=2)


@contextmanager
def session(launch: Optional[Launch] = None, *, sp: int = 1, device: str = "auto",
            on_abort: Optional[Callable[[], None]] = None) -> Iterator[Mesh]:
    """Join the process group of this launch (``Launch.from_env()`` by default) and yield its mesh,
    the one object that says which process this is and what it shares with the others (``single()``,
    without touching torch, in a process that runs alone). ``device`` is the models' device setting
    (``model.device``). ``on_abort`` runs (best effort) when another process's failure ends this one.

    Besides the default group (NCCL on GPUs), the mesh has a gloo group of all processes, ``control``,
    for what the host decides and shares (seed and config, resume point, report): waiting there while
    process 0 finishes the file occupies no GPU and no NCCL watchdog."""
    launch = launch or Launch.from_env()
    if launch.world == 1:
        yield single()
        return
    import torch.distributed as dist

    master = launch.rank == 0 and not launch.agent_store
    store = _store(launch, master=master)
    watch = AbortWatch(launch, on_abort)
    control = None
    try:
        where, backend = pick_device(launch, device)
        pinned = (pin_near(gpu_bus_id(where.index)) if where.type == "cuda"
                  else Affinity(None, why="the models run on the CPU (gloo)"))
        dist.init_process_group(backend, store=dist.PrefixStore("avatar_render/pg", store), timeout=COLLECTIVE_TIMEOUT,
                                rank=launch.rank, world_size=launch.world,
                                device_id=where if backend == "nccl" else None)
        control = dist.new_group(backend="gloo", timeout=CONTROL_TIMEOUT)
        everyone: list = [None] * launch.world
        dist.all_gather_object(everyone, pinned, group=control)
        mesh = build_mesh(launch, sp=sp, device=where, backend=backend, affinity=describe(everyone))
        mesh = dataclasses.replace(mesh, control=control)
        yield mesh
        dist.barrier(group=control)
    except BaseException as exc:
        if not watch.claim():  # another process failed first and says so
            watch.stop()
            watch.end()
        watch.stop()
        # Gloo groups are torn down locally; left alive they hold up this process's exit.
        if control is not None:
            dist.destroy_process_group(control)
        if dist.is_initialized() and dist.get_backend() == "gloo":
            dist.destroy_process_group()
        if isinstance(exc, AvatarRenderError):
            raise AvatarRenderError(f"{str(exc).rstrip('.')} (process {launch.rank} of {launch.world}).") from None
        raise
    watch.stop()
    dist.destroy_process_group()


def digest(value: object) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()


def agree(mesh: Mesh, what: str, value: object) -> None:
    """Fail unless every process holds the same ``value`` (a JSON-able plan, seed, config)."""
    if not mesh.distributed:
        return
    import torch.distributed as dist

    mine = digest(value)
    seen: list = [None] * mesh.world
    dist.all_gather_object(seen, mine, group=mesh.control)
    if len(set(seen)) > 1:
        odd = [r for r, h in enumerate(seen) if h != seen[0]]
        raise AvatarRenderError(f"The processes disagree on the {what} (process {odd[0]} differs from process 0); "
                                "start them all with the same command.")


def broadcast(mesh: Mesh, value: object) -> object:
    """Process 0's ``value`` on every process."""
    if not mesh.distributed:
        return value
    import torch.distributed as dist

    box = [value]
    dist.broadcast_object_list(box, src=0, group=mesh.control)
    return box[0]


def is_writer_process() -> bool:
    """True except in the processes of a torchrun launch that do not write (rank > 0)."""
    return Launch.from_env().rank == 0
