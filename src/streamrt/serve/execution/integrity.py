"""Batch integrity: no request may receive another request's rows.

A batch concatenates the rows of several requests; its outputs are split back by row counts. That
split is only right when every output's first dimension *is* the batch's rows. A model whose
output does not keep the batch dimension (a ReduceMean without ``axes``, an output with a fixed
first dimension declared as dynamic) would otherwise hand the first request a value computed from
every request and the others empty arrays, with status OK. Two guards stand in front of the split:

* **At load** (:func:`probe_batch_outputs`): the first instance runs the model at two batch sizes
  (1 and ``max_batch_size``); an output whose first dimension does not follow is reported with the
  shapes seen. :func:`batch_refusal` words the refusal, or the switch to batching off when the
  config leaves ``max_batch_size`` out (the server chose batching, so it may take it back).
* **On every batch** (:class:`OutputCheck`): before the split, each output's first dimension must
  be the batch's total rows, and its dtype and trailing dims those of the config; otherwise the
  whole batch fails with :class:`~streamrt.errors.OutputMismatchError` (HTTP 500, gRPC INTERNAL,
  failure reason BACKEND through :mod:`streamrt.serve.wire.status`), naming model, output and shapes.

Example:
    >>> from streamrt.serve.configs.config import TensorConfig
    >>> from streamrt.types import DType
    >>> check = OutputCheck("m", (TensorConfig("y", DType.FLOAT32, (2,)),), batched=True)
    >>> check({"y": np.zeros((3, 2), np.float32)}, rows=3)     # fine: returns None
    >>> try:
    ...     check({"y": np.zeros((1, 2), np.float32)}, rows=3)
    ... except OutputMismatchError as e:
    ...     print(e.message[:63])
    model 'm': output 'y' has shape [1, 2] for a batch of 3 rows; i
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np

from streamrt.errors import OutputMismatchError
from streamrt.serve.configs.config import TensorConfig

__all__ = ["OutputCheck", "batch_refusal", "probe_batch_outputs", "probe_sizes"]

Shapes = dict[int, tuple[int, ...]]
"""Batch size -> the output shape seen at that batch size."""


def _dims(shape: Sequence[int]) -> str:
    return str([int(d) for d in shape])


class OutputCheck:
    """Checks one batch's outputs against its rows and the model config, before they are split.

    Args:
        model: the model's name, for messages.
        outputs: the config's outputs (dims, or ``reshape`` where given, without the batch dimension
            when ``batched``).
        batched: the model has a batch dimension (``max_batch_size > 0``).
    """

    __slots__ = ("_expected", "batched", "model")

    def __init__(self, model: str, outputs: Sequence[TensorConfig], *, batched: bool) -> None:
        self.model = model
        self.batched = batched
        # The engine's side of each output: Triton's ``reshape`` when the config gives one.
        self._expected = tuple((t.name, np.dtype(t.data_type.numpy), t.model_dims, t.data_type.kserve)
                               for t in outputs)

    def __call__(self, outputs: Mapping[str, np.ndarray], rows: int) -> None:
        """Raise :class:`OutputMismatchError` unless every configured output fits a batch of ``rows``."""
        for name, dtype, dims, kserve in self._expected:
            value = outputs.get(name)
            if value is None:
                raise OutputMismatchError(
                    f"model '{self.model}': the engine returned no output '{name}' "
                    f"(it returned {', '.join(outputs) or 'nothing'})")
            shape = value.shape
            if self.batched and (not shape or shape[0] != rows):
                raise OutputMismatchError(
                    f"model '{self.model}': output '{name}' has shape {_dims(shape)} for a batch of {rows} rows; "
                    f"its first dimension must be {rows}, so the batch failed rather than hand one request "
                    "another request's rows",
                    hint="the model's outputs must keep the batch dimension; serve it with max_batch_size: 0 if not")
            if value.dtype != dtype and not (dtype.kind == "O" and value.dtype.kind in "OSU"):  # BYTES: any strings
                raise OutputMismatchError(
                    f"model '{self.model}': output '{name}' is {value.dtype} but the config says TYPE_{kserve} "
                    f"({dtype}); the batch failed")
            rest = shape[1:] if self.batched else shape
            if len(rest) != len(dims) or any(d not in (-1, s) for s, d in zip(rest, dims, strict=False)):
                want = [rows, *dims] if self.batched else list(dims)
                raise OutputMismatchError(
                    f"model '{self.model}': output '{name}' has shape {_dims(shape)} but the config says {want} "
                    "(-1: any size); the batch failed")


def probe_sizes(max_batch_size: int) -> tuple[int, ...]:
    """The batch sizes of the load-time probe: 1 and ``max_batch_size`` (just 1 when that is 1)."""
    return (1, max_batch_size) if max_batch_size > 1 else (1,)


def probe_batch_outputs(
    run: Callable[[int], Mapping[str, np.ndarray] | None], outputs: Sequence[str], sizes: Sequence[int]
) -> dict[str, Shapes]:
    """Run the model at each batch size; return the outputs whose first dimension does not follow.

    Args:
        run: runs one batch of the given size and returns every output (None: no inputs can be made
            for it, e.g. dynamic dims without a profile; that size is skipped).
        outputs: the output names to check.
        sizes: batch sizes to try (:func:`probe_sizes`).

    Returns:
        ``{output: {batch size: shape}}`` for each offending output, with the shapes at every size run.
    """
    seen: dict[str, Shapes] = {name: {} for name in outputs}
    for size in sizes:
        result = run(size)
        if result is None:
            continue
        for name in outputs:
            if name in result:
                seen[name][size] = tuple(int(d) for d in result[name].shape)
    return {name: shapes for name, shapes in seen.items()
            if any(not shape or shape[0] != size for size, shape in shapes.items())}


def batch_refusal(model: str, offenders: Mapping[str, Shapes], *, max_batch_size: int, fallback: bool,
                  why: str | None = None) -> str:
    """The load-time message for outputs that do not follow the batch: refused (``why``, by default
    because the config asks for batching), or batching turned off."""
    described = "; ".join(
        f"output '{name}' has shape " + ", ".join(f"{_dims(s)} for a batch of {b}" for b, s in shapes.items())
        for name, shapes in offenders.items())
    head = f"model '{model}': {described}: the first dimension does not follow the batch, so batched requests " \
           "would receive other requests' data"
    if fallback:
        return f"{head}; loaded with batching off (max_batch_size: 0, whole tensors in and out) because the " \
               "config leaves max_batch_size out"
    return f"{head}; refused because {why or f'the config asks for batching (max_batch_size {max_batch_size})'}"
