"""Many renders: a folder or a manifest of jobs, each an ordinary ``api.render`` in its own process.

* ``sources``: jobs from a folder (reference and audio paired by file stem, or one ``--ref`` for
  every audio) or from a manifest (``manifest``: CSV or JSONL, refused row by row with line numbers).
* ``ledger``: what each output was rendered from, so that a second run skips finished jobs and
  resumes interrupted ones.
* ``shard``: a deterministic, disjoint part of the jobs (``--shard I/N`` or a Slurm array).
* ``pool``: jobs side by side on this machine, one process each (``worker``); ``ray_launcher``:
  the same jobs as Ray tasks.
* ``summary``: the JSON summary and a static HTML page with thumbnails; ``view``: the progress view.
* ``run``: ``run_batch(BatchRequest) -> BatchResult``, the entry point that ties them together.
"""

from avatar_render.batch.jobs import Job, Outcome
from avatar_render.batch.run import BatchRequest, BatchResult, plan_batch, run_batch
from avatar_render.batch.shard import Shard

__all__ = ["BatchRequest", "BatchResult", "Job", "Outcome", "Shard", "plan_batch", "run_batch"]
