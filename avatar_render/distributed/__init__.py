"""One request across the processes of a ``torchrun`` launch: mesh and launch, FSDP2 sharding
(parallelize), Ulysses sequence parallelism, CFG parallelism, the split VAE decode and NUMA pinning;
and, for one process, the DiT's blocks streamed from host memory (streaming). A leaf: it imports only
the core (config, errors) and torch; the api calls it, the backends and models use what it gives them.
In a single process the multi-process parts are no-ops, and importing the package does not import torch."""
