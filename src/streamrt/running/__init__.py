"""The run side: loading plans and feeding engines, without any build code.

``runtime`` (:func:`streamrt.load`: read and check a plan, pick its backend, make the engine),
``inputs`` (random and file feeds for an engine's inputs: the one random-input generator) and
``compare`` (an engine's outputs against a reference, ``streamrt compare``).

May import ``backends`` and the rooms below; never ``building`` or ``verify`` (the
engines-without-builders contract and ``tests/backends/test_load_imports.py`` check it).
"""
