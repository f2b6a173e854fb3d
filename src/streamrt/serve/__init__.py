"""The StreamRT model server: KServe v2 / Triton protocol over HTTP and gRPC.

A repository of models (plans, or ONNX built on load), a dynamic batcher and instance group per
model, and Prometheus metrics with Triton's names. The perf_analyzer-style load generator is a
client: :mod:`streamrt.client.loadgen`. See ``docs/serving.md``.

The package's public surface is this module's ``__all__``. Inside, the entry points stay on top
(:mod:`.server`, :mod:`.core`, :mod:`.port`, :mod:`.process`) and the rest lives in concern
folders, each ``__init__`` saying what it owns and what it exports, top to bottom:
:mod:`.listeners` (HTTP, gRPC, metrics, multi-process front ends), :mod:`.models` (servable
model kinds, the repository), :mod:`.scheduling` (batchers), :mod:`.execution` (instances,
placement, memory, integrity, rate limits), :mod:`.configs`, :mod:`.wire` (codecs, shared
memory, status) and :mod:`.observability` (stats, tracing). A room imports only rooms below it
(docs/architecture.md, checked by ``lint-imports``).

Example:
    >>> from streamrt.serve import ServerConfig, ServerThread
    >>> with ServerThread("models", ServerConfig(http_port=0)) as server:   # doctest: +SKIP
    ...     print(server.http_port)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from streamrt.serve.configs.config import (
    BatchingConfig,
    InstanceGroupConfig,
    ModelConfig,
    QueuePolicy,
    ServerConfig,
    TensorConfig,
    VersionPolicy,
    WarmupConfig,
)
from streamrt.serve.configs.ensemble_config import EnsembleConfig, EnsembleStep

__all__ = [
    "BatchingConfig",
    "EnsembleConfig",
    "EnsembleStep",
    "InferenceServer",
    "InstanceGroupConfig",
    "ModelConfig",
    "ModelRepository",
    "QueuePolicy",
    "ServerConfig",
    "ServerThread",
    "TensorConfig",
    "VersionPolicy",
    "WarmupConfig",
]

if TYPE_CHECKING:
    from streamrt.serve.models.repository import ModelRepository
    from streamrt.serve.server import InferenceServer, ServerThread

_LAZY = {
    "InferenceServer": "streamrt.serve.server",
    "ServerThread": "streamrt.serve.server",
    "ModelRepository": "streamrt.serve.models.repository",
}


def __getattr__(name: str) -> Any:
    # Lazy: `streamrt.serve.configs.config` must not pull in the backends or asyncio machinery.
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'streamrt.serve' has no attribute {name!r}")
