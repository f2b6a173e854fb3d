"""What a load generator run sends, where, and how hard: :class:`LoadConfig` (apart from
:mod:`streamrt.client.loadgen`, which drives it, so that the protocol clients can name it too)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from streamrt.errors import ConfigError

__all__ = ["GRPC_CHANNEL_SHARE", "LoadConfig"]

GRPC_CHANNEL_SHARE = 0
"""Concurrent requests per gRPC channel by default: 0, one channel (one connection) per client process.
tritonclient's C++ library opens a new channel once 6 clients share one (triton-inference-server/client#55);
``grpc_channel_share=6`` does the same. Not the default: on the 2-core CPU machine 64 B requests over 16
connections ran at 0.80-1.04x the rate over 8, no gain (docs/benchmarks/2026-12-05-frontend-balance-cpu.md)."""


@dataclass(frozen=True)
class LoadConfig:
    """What to send, where, and how hard.

    Attributes:
        url: ``host:port`` of the HTTP or gRPC endpoint.
        model / version: target model ("" = the server's default version).
        protocol: ``"http"`` or ``"grpc"``.
        concurrency: levels to sweep (outstanding requests).
        batch_size: rows per request (models with a batch dimension).
        shapes: dims (without batch) for inputs whose metadata has -1 dims.
        data: ``"random"`` or ``"zero"``.
        binary: HTTP: tensors as binary data (else JSON); gRPC is always binary.
        duration_s / warmup_s: measurement window and warm-up per level.
        timeout_s: per-request timeout.
        headers: extra HTTP headers / gRPC metadata (e.g. ``authorization``).
        processes: client processes sharing each concurrency level (>= 1).
        shared_memory: ``"none"``, ``"system"`` or ``"cuda"`` (inputs and outputs in registered regions).
        output_shared_memory_size: bytes per output region when an output's size is not static.
        request_ids: give each request its own id and keep its send and answer times (``request_log``).
        grpc_channel_share: gRPC: concurrent requests per channel, each channel its own connection (6:
            tritonclient's C++ rule); 0 (the default): one channel per process. With several front-end
            processes on one port (SO_REUSEPORT) the kernel places connections, not requests, so few
            connections spread unevenly over them.
    """

    url: str
    model: str
    version: str = ""
    protocol: str = "http"
    concurrency: tuple[int, ...] = (1,)
    batch_size: int = 1
    shapes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    data: str = "random"
    binary: bool = True
    duration_s: float = 5.0
    warmup_s: float = 1.0
    timeout_s: float = 30.0
    headers: Mapping[str, str] = field(default_factory=dict)
    processes: int = 1
    shared_memory: str = "none"
    output_shared_memory_size: int = 102400
    request_ids: bool = False
    grpc_channel_share: int = GRPC_CHANNEL_SHARE

    def __post_init__(self) -> None:
        if self.protocol not in ("http", "grpc"):
            raise ConfigError(f"protocol must be http or grpc, got {self.protocol!r}")
        if not self.concurrency or min(self.concurrency) < 1:
            raise ConfigError(f"concurrency levels must be integers >= 1, got {self.concurrency}")
        if self.batch_size < 1:
            raise ConfigError(f"batch_size must be an integer >= 1, got {self.batch_size}")
        if self.data not in ("random", "zero"):
            raise ConfigError(f"data must be random or zero, got {self.data!r}")
        if self.duration_s <= 0:
            raise ConfigError(f"duration_s must be > 0, got {self.duration_s}")
        if self.processes < 1:
            raise ConfigError(f"processes must be an integer >= 1, got {self.processes}")
        if self.shared_memory not in ("none", "system", "cuda"):
            raise ConfigError(f"shared_memory must be none, system or cuda, got {self.shared_memory!r}")
        if self.grpc_channel_share < 0:
            raise ConfigError(f"grpc_channel_share must be >= 0 (0: one channel per process), "
                              f"got {self.grpc_channel_share}")
        if self.grpc_channel_share and self.protocol != "grpc":  # HTTP opens a connection per request anyway
            raise ConfigError(f"grpc_channel_share applies to gRPC only, got {self.grpc_channel_share} with "
                              f"protocol {self.protocol}")
        if self.output_shared_memory_size < 1:
            raise ConfigError(f"output_shared_memory_size must be >= 1, got {self.output_shared_memory_size}")
