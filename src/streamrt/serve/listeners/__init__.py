"""The listeners room: the network front ends, over an inference port.

Owns the HTTP/REST app (:mod:`.http`), the gRPC service (:mod:`.grpc_service`), the Prometheus
endpoint (:mod:`.metrics`) and the multi-process front ends of ``--frontend-processes N``
(:mod:`.frontends`: a worker process is the same listeners over a port that forwards to the
engine process). They live here rather than in a room of their own because they are listeners in
another process and must keep the same rule.

May import: :mod:`streamrt.serve.core` (the non-inference routes: repository, statistics,
shared-memory registration), :mod:`streamrt.serve.port`, :mod:`streamrt.serve.configs`,
:mod:`streamrt.serve.wire`, :mod:`streamrt.serve.observability`, :mod:`streamrt.serve.process`;
never a model, a scheduler or the execution room directly (the ``listeners-without-execution``
contract): every request reaches a model through the core. Outside this room only
:mod:`streamrt.serve.server` starts a listener (the CLI takes ``http.quiet_bad_requests``).

Public surface (each module's ``__all__``):

* :mod:`.http`: ``build_app``, ``start_http``, ``InferenceRoutes``, ``ServerRoutes``, ``answer_infer``,
  ``quiet_bad_requests``, ``read_body``, ``BadRequestLogFilter``;
* :mod:`.http_h2corn`: ``start_http_h2corn``, ``HttpAsgi``, ``infer_route`` (``--http-server h2corn``: the
  inference route on h2corn, the rest forwarded by :mod:`.http_forward`'s ``HttpForwarder`` to the aiohttp app);
* :mod:`.h2corn_server`: ``serve_asgi``, ``default_threads`` (h2corn in the server's loop, for gRPC and HTTP);
* :mod:`.grpc_service`: ``start_grpc``, ``grpc_server``, ``bind_grpc``, ``service_handler``,
  ``GrpcService``, ``InferenceRpcs``, ``UNARY_RPCS``, ``UNPARSABLE``, the request/response codecs;
* :mod:`.metrics`: ``start_metrics``, ``collect``, ``render``;
* :mod:`.frontends`: ``supervisor.FrontendSupervisor`` and ``worker.main`` (the rest of it is the
  private protocol between those two).
"""
