"""Measures, NumPy only: summary statistics of samples (``stats``), the shared noise rule
(``noise``), throughput measured in rounds (``rounds``) and the accuracy of a low-precision plan
against its fp32 reference (``accuracy``).

These are arithmetic on numbers other rooms collect: the profiling room (``bench``, ``demo``), the
build side (the accuracy gate, the int8 speed check) and the configs (``BuildConfig`` checks its
``accuracy_threshold`` grammar here) all read them, so they sit below all of them.
"""
