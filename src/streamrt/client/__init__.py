"""Clients of a KServe v2 / Triton server (StreamRT's or any other): the load generator.

They speak the wire protocol of :mod:`streamrt.serve.protocol` and :mod:`streamrt.serve.proto`
and import nothing else of the server.
"""
