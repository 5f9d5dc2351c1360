"""Every file the package reads or writes goes through this room.

* ``read``: what a command reads (references, audio, configs, manifests, ledgers, reports) is checked
  to be a readable regular file before it is opened (a FIFO would block, a device stream forever),
  and text and JSON are read with limits on size and depth, their errors one sentence.
* ``write``: what a command writes is created exclusively, opened without following links, and
  replaced atomically through a temporary file of its own; it removes only what it made.
* ``targets``: whether a path may be written at all, checked before any work: never one of the run's
  inputs (device and inode), never through a link, never over something this program did not write
  (recognised by its signature) unless the user passed ``--force``, never outside the folder the user
  named.
"""
