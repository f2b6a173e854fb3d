"""KServe v2 gRPC messages, built at import time in a private protobuf descriptor pool.

``kserve_v2.proto`` is StreamRT's wire-compatible subset of the ``inference`` package and
``model_config.proto`` the whole of Triton's model-configuration schema; their compiled
descriptors are embedded in ``_descriptor.py`` and ``_model_config_descriptor.py`` (see
:mod:`.generate` for why not ``_pb2.py`` files). Needs ``protobuf >= 4.25`` (the ``serve``
extra); no grpcio-tools at run time.

Example:
    >>> from streamrt.serve.wire.proto import messages
    >>> messages.ServerLiveResponse(live=True).live
    True
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from streamrt._optional import require

__all__ = ["SERVICE", "messages"]

SERVICE = "inference.GRPCInferenceService"
"""The full gRPC service name; method paths are ``/inference.GRPCInferenceService/<Method>``."""


def _build() -> SimpleNamespace:
    require("google.protobuf", extra="serve", purpose="the gRPC front end")
    from google.protobuf import descriptor_pool, message_factory

    from streamrt.serve.wire.proto import _descriptor, _model_config_descriptor

    pool = descriptor_pool.DescriptorPool()
    classes: dict[str, Any] = {}
    for module in (_model_config_descriptor, _descriptor):  # dependencies first
        file = pool.AddSerializedFile(module.SERIALIZED)
        for name, desc in file.message_types_by_name.items():
            classes[name] = message_factory.GetMessageClass(desc)
        for name, enum in file.enum_types_by_name.items():
            classes[name] = enum
    return SimpleNamespace(**classes)


_MESSAGES: SimpleNamespace | None = None


def __getattr__(name: str) -> Any:
    # Built on first use so that `python -m streamrt.serve.wire.proto.generate` runs without a descriptor.
    global _MESSAGES
    if name == "messages":
        if _MESSAGES is None:
            _MESSAGES = _build()
        return _MESSAGES
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
