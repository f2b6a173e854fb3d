"""An ensemble's ``ensemble_scheduling`` (Triton's ``ModelEnsembling``) and the checks on its graph.

Each :class:`EnsembleStep` runs one model: ``input_map`` maps the step model's input names to
ensemble tensors, ``output_map`` the step model's output names to ensemble tensors. The ensemble
tensors are the ensemble's own inputs and whatever the steps produce; :meth:`EnsembleConfig.order`
checks that they form a DAG whose every consumed tensor and every ensemble output has exactly one
producer, and returns the steps in an order in which each comes after the steps it needs.

Example:
    >>> cfg = EnsembleConfig((EnsembleStep("a", -1, {"x": "IN"}, {"y": "MID"}),
    ...                       EnsembleStep("b", -1, {"x": "MID"}, {"y": "OUT"})))
    >>> cfg.order("e", ["IN"], ["OUT"])
    (0, 1)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from streamrt.errors import ConfigError

__all__ = ["EnsembleConfig", "EnsembleStep"]


@dataclass(frozen=True)
class EnsembleStep:
    """One step: ``model_name`` at ``model_version`` (-1: the latest served version).

    Attributes:
        input_map: step model input -> ensemble tensor it reads.
        output_map: step model output -> ensemble tensor it writes.
    """

    model_name: str
    model_version: int = -1
    input_map: Mapping[str, str] = field(default_factory=dict)
    output_map: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.model_name:
            raise ConfigError("every ensemble step needs a model_name")
        if self.model_version < -1 or self.model_version == 0:
            raise ConfigError(f"step '{self.model_name}': model_version must be -1 (latest) or >= 1, "
                              f"got {self.model_version}")
        if not self.input_map or not self.output_map:
            raise ConfigError(f"step '{self.model_name}': input_map and output_map must each map at least one "
                              "tensor", hint="input_map { key: \"<model input>\" value: \"<ensemble tensor>\" }")

    @property
    def version(self) -> str:
        """The version as the repository's lookups take it (``""``: the latest)."""
        return "" if self.model_version == -1 else str(self.model_version)

    def describe(self, index: int) -> str:
        return f"step {index} (model '{self.model_name}')"


@dataclass(frozen=True)
class EnsembleConfig:
    """Triton's ``ensemble_scheduling``: the steps of an ensemble, in config order."""

    steps: tuple[EnsembleStep, ...]

    def __post_init__(self) -> None:
        if not self.steps:
            raise ConfigError("ensemble_scheduling needs at least one step")

    def order(self, model: str, inputs: Iterable[str], outputs: Iterable[str]) -> tuple[int, ...]:
        """Step indices in dependency order (Kahn's algorithm over the tensors).

        Raises:
            ConfigError: a tensor produced twice (or by a step and the request), a step input or an
                ensemble output that nothing produces, an ensemble input no step reads, or a cycle.
        """
        where = f"ensemble '{model}'"
        given = list(inputs)
        producer: dict[str, str] = {name: "the ensemble's inputs" for name in given}
        for i, step in enumerate(self.steps):
            for tensor in step.output_map.values():
                if tensor in producer:
                    raise ConfigError(f"{where}: tensor '{tensor}' is produced by both {producer[tensor]} and "
                                      f"{step.describe(i)}", hint="each ensemble tensor has exactly one producer")
                producer[tensor] = step.describe(i)
        consumed = {t for step in self.steps for t in step.input_map.values()}
        for i, step in enumerate(self.steps):
            for key, tensor in step.input_map.items():
                if tensor not in producer:
                    raise ConfigError(f"{where}: {step.describe(i)} input '{key}' reads tensor '{tensor}', which "
                                      f"no step produces and is not an ensemble input ({', '.join(given)})")
        for name in outputs:
            if name not in producer or name in given:
                raise ConfigError(f"{where}: output '{name}' is not produced by any step",
                                  hint=f"map a step output to it: output_map {{ key: \"<model output>\" "
                                       f"value: \"{name}\" }}")
        unused = [name for name in given if name not in consumed]
        if unused:
            raise ConfigError(f"{where}: input '{unused[0]}' is not read by any step",
                              hint="map it in a step's input_map or remove it from the ensemble's inputs")
        ready = set(given)
        order: list[int] = []
        waiting = list(range(len(self.steps)))
        while waiting:
            runnable = [i for i in waiting if set(self.steps[i].input_map.values()) <= ready]
            if not runnable:
                stuck = ", ".join(self.steps[i].describe(i) for i in waiting)
                raise ConfigError(f"{where}: the steps form a cycle: {stuck} each wait for another's output",
                                  hint="an ensemble is a DAG: no step may read what it (or a later step) produces")
            for i in runnable:
                order.append(i)
                waiting.remove(i)
                ready.update(self.steps[i].output_map.values())
        return tuple(order)
