"""The wire room: what a request and a response look like on the network, and nothing else.

Owns the KServe v2 tensor encoding (JSON and binary, :mod:`.protocol`), the gRPC message framing
without grpcio (:mod:`.grpc_wire`), the generated gRPC messages (:mod:`.proto`), system and CUDA
shared-memory regions that requests point into (:mod:`.shared_memory`) and the one table from
exceptions to HTTP/gRPC status (:mod:`.status`).

May import: :mod:`streamrt.serve.observability`, :mod:`streamrt.serve.process` and the layers
below serve/ (errors, types); never a config, a model or a listener (the ``serve-rooms`` contract
in ``pyproject.toml``), so a client-side decoder can use it without the server.

Public surface (each module's ``__all__``):

* :mod:`.http_headers`: ``RequestLayout``, ``BinaryInput``, ``BoundedTable`` (what the codec remembers);
* :mod:`.bytes_tensor`: ``serialize_bytes``, ``deserialize_bytes`` (BYTES in binary form, also in regions);
* :mod:`.protocol`: ``InferRequest``, ``InferResponse``, ``RequestedOutput``, ``SequenceFlags``,
  ``decode_http_request``, ``encode_http_response``, the dtype and byte-tensor helpers;
* :mod:`.grpc_wire`: ``split_infer_request``, ``encode_infer_response``, ``encode_length_delimited``;
* :mod:`.shared_memory`: ``SharedMemoryRegistry``, ``RegionRef``, ``RegionSource``, ``DeviceTensor``,
  ``region_ref``;
* :mod:`.status`: ``status_for``, ``Status``, ``STATUS_TABLE``;
* :mod:`.proto`: ``messages``, ``SERVICE`` (``proto/_descriptor.py`` and
  ``proto/_model_config_descriptor.py`` are generated and private).
"""
