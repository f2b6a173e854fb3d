"""Clients of a KServe v2 / Triton server (StreamRT's or any other): the load generator.

They speak the wire protocol of :mod:`streamrt.serve.wire.protocol` and :mod:`streamrt.serve.wire.proto`
and import nothing else of the server.
"""
