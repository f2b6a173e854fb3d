"""Front ends over several processes: ``streamrt serve --frontend-processes N`` (N > 1).

The engine process (models, batcher, instances, metrics) starts N worker processes that bind the
public HTTP and gRPC ports with ``SO_REUSEPORT``, parse requests, and hand tensors to the engine
process through a shared-memory arena per worker. See docs/serving-frontends.md.

* :mod:`.arena`: the per-worker shared memory (memfd) and its allocator;
* :mod:`.channel`: the framed messages between a worker and the engine process;
* :mod:`.tensors`: requests and responses packed into and viewed from the arena;
* :mod:`.supervisor`: the engine process's side (spawn, serve, restart, stop);
* :mod:`.worker`: the worker process.
"""
