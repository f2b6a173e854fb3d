"""Triton's classification extension: an output's top-k classes as ``"score:index:label"`` strings.

A request that gives an output the ``classification`` parameter (HTTP) or ``class_count`` (what
tritonclient's ``InferRequestedOutput(name, class_count=k)`` sends on both protocols) gets, in
place of the tensor, a BYTES tensor of the k highest scores of each batch row, best first, each
written as Triton writes it: the score with six decimals (C's ``%f``), the flat index, and the
label when the output's ``label_filename`` has one for that index (``"0.930001:3:cat"``,
``"0.930001:3"`` without a label). Shape: ``[batch, k]`` for a batching model, ``[k]`` otherwise.

Example:
    >>> top_k_classes(np.array([0.1, 0.7, 0.2], np.float32), 2, ["a", "b", "c"], batched=False).tolist()
    [b'0.700000:1:b', b'0.200000:2:c']
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from streamrt.errors import ConfigError, RequestError

if TYPE_CHECKING:
    from streamrt.serve.configs.config import ModelConfig

__all__ = ["read_labels", "top_k_classes"]


def read_labels(model_dir: Path, config: ModelConfig) -> dict[str, list[str]]:
    """The label lines of every output with a ``label_filename`` (in the model directory, as Triton).

    Raises:
        ConfigError: a label file that does not exist.
    """
    labels = {}
    for output in config.output:
        if not output.label_filename:
            continue
        path = model_dir / output.label_filename
        if not path.is_file():
            raise ConfigError(f"model '{config.name}': label_filename '{output.label_filename}' of output "
                              f"'{output.name}' is not in {model_dir}")
        labels[output.name] = path.read_text().splitlines()
    return labels


def top_k_classes(array: np.ndarray, k: int, labels: Sequence[str], *, batched: bool) -> np.ndarray:
    """The top-``k`` strings of each row of ``array`` (all of it when not ``batched``).

    Raises:
        RequestError: a non-numeric output (BYTES or BOOL cannot be ranked).
    """
    if array.dtype == object or (array.dtype.kind not in "iuf" and array.dtype.name != "bfloat16"):
        raise RequestError(f"classification needs a numeric output, this one is {array.dtype}")
    rows = array.reshape(array.shape[0] if batched else 1, -1).astype(np.float64)
    count = min(k, rows.shape[1])
    out = np.empty((rows.shape[0], count), dtype=object)
    for r, row in enumerate(rows):
        order = np.argsort(-row, kind="stable")[:count]
        for c, index in enumerate(order):
            label = labels[index] if index < len(labels) else ""
            text = f"{row[index]:f}:{index}" + (f":{label}" if label else "")
            out[r, c] = text.encode()
    return out if batched else out[0]
