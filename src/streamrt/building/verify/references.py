"""What verification runs: a reference, the plan, and the inputs both are fed.

The reference is ONNX Runtime fp32 on the source model (:func:`onnx_reference`, ONNX builds) or
the eager PyTorch module in fp32 (:func:`module_reference`, ``build_module``). Inputs are the
user's data where their shapes fit (``--sample-inputs``, else the calibration samples; read with
the loaders the accuracy gate uses, :func:`streamrt.running.inputs.load_inputs` and
:class:`~streamrt.onnx.calibration.CalibrationDataset`) and fresh seeded random data elsewhere:
random noise says little about an image model, and a detector's map is ~0 on it.

Engines return their own output buffers (none takes the caller's), so they cannot be poisoned
directly. Instead the plan runs once on a poison feed of the same shapes before each of the two
calls that are compared, a different poison each time (:meth:`Inputs.poison`): a plan that reads
memory nobody wrote in this call then reads the poison runs' leftovers, which differ.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from streamrt.config import BuildConfig
from streamrt.onnx.model import OnnxModel
from streamrt.running.inputs import cast_inputs, random_inputs, shapes_of, to_device, to_numpy
from streamrt.types import DType, Shape, ShapeProfile, TensorSpec

__all__ = ["Arrays", "Inputs", "PlanRunner", "Reference", "Runner", "module_reference", "onnx_reference", "user_inputs"]

Arrays = dict[str, np.ndarray]
Runner = Callable[[Arrays], Arrays]

_SEED = 0
_MAX_SAMPLES = 8  # as many calibration samples as the accuracy gate reads
_POISON = (1.0e3, -1.0e3)  # constant float feeds of the two poison runs


@dataclass(frozen=True)
class Reference:
    """What a plan is judged against.

    Attributes:
        run: inputs by name -> outputs by name, in fp32.
        inputs: the input specs random data is drawn for (fp32 floats).
        label: how messages and the manifest name it, e.g. ``ONNX Runtime fp32``.
    """

    run: Runner
    inputs: tuple[TensorSpec, ...]
    label: str


def onnx_reference(model: OnnxModel) -> Reference:
    """ONNX Runtime fp32 (CPU) on ``model``."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 4  # failures become exceptions here; ORT's own log would repeat them
    source = str(model.path) if model.path is not None else model.proto.SerializeToString()
    session = ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]

    def run(inputs: Arrays) -> Arrays:
        return dict(zip(names, (np.asarray(v) for v in session.run(names, inputs)), strict=True))

    return Reference(run, tuple(model.inputs), "ONNX Runtime fp32 (source model)")


def module_reference(
    module: Any, inputs: Sequence[TensorSpec], output_names: Sequence[str], device: str = "cpu"
) -> Reference:
    """The eager PyTorch ``module`` in fp32 (a copy in eval mode on ``device``, TF32 off).

    Args:
        module: the ``torch.nn.Module`` the plan was built from (not changed).
        inputs: the plan's inputs, in ``forward``'s argument order (floats are fed as fp32).
        output_names: names for ``forward``'s outputs (a tensor or a tuple of tensors), in order.
        device: ``cpu`` or ``cuda``, where the plan runs.
    """
    import torch

    net = copy.deepcopy(module).eval().float().to(device)
    names = [s.name for s in inputs]
    floats = {DType.FLOAT16, DType.BFLOAT16, DType.FLOAT32, DType.FLOAT64}
    specs = tuple(TensorSpec(s.name, DType.FLOAT32 if s.dtype in floats else s.dtype, s.shape) for s in inputs)

    def run(feeds: Arrays) -> Arrays:
        args = [torch.from_numpy(np.ascontiguousarray(feeds[n])).to(device) for n in names]
        with torch.no_grad(), _ieee_fp32(device):
            out = net(*args)
        outs = [out] if isinstance(out, torch.Tensor) else list(out)
        return {n: o.detach().cpu().numpy() for n, o in zip(output_names, outs, strict=True)}

    return Reference(run, specs, "eager PyTorch fp32 (the module)")


def _ieee_fp32(device: str) -> Any:
    """TF32 off around a CUDA reference call (torch enables it for cuDNN convolutions by default)."""
    import contextlib

    if not device.startswith("cuda"):
        return contextlib.nullcontext()
    from streamrt.backends.torch_inductor.tf32 import backend_flags

    return backend_flags(False)


class PlanRunner:
    """Runs a loaded engine on host arrays and returns host copies of its outputs."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.ctx = engine.create_context()

    def __call__(self, inputs: Arrays) -> Arrays:
        feeds = to_device(cast_inputs(inputs, self.engine.inputs), self.engine.device_kind)
        outputs = self.ctx.infer(feeds)
        if self.engine.device_kind == "cuda":
            import torch

            torch.cuda.synchronize()
        return {name: np.array(to_numpy(v)) for name, v in outputs.items()}

    def close(self) -> None:
        self.ctx.close()


@dataclass(frozen=True)
class Inputs:
    """The feeds of verification: the user's samples where their shapes fit, seeded random elsewhere.

    Attributes:
        specs: the reference's inputs.
        samples: the user's feeds (may be empty).
        source: where they came from, e.g. ``sample inputs page.npz`` (empty without samples).
    """

    specs: tuple[TensorSpec, ...]
    samples: tuple[Arrays, ...] = ()
    source: str = ""

    def _sample(self, shapes: Mapping[str, Shape]) -> Arrays | None:
        return next((s for s in self.samples if shapes_of(s) == dict(shapes)), None)

    def at(self, shapes: Mapping[str, Shape]) -> tuple[Arrays, str]:
        """A feed at ``shapes`` and what it is: a user sample of exactly these shapes, else random."""
        sample = self._sample(shapes)
        if sample is not None:
            return sample, self.source
        return random_inputs(self.specs, shapes, np.random.default_rng(_SEED)), "random"

    def data_at(self, shapes: Mapping[str, Shape]) -> str:
        """What :meth:`at` would feed at ``shapes`` (``random`` or the samples' source), without making it."""
        return self.source if self._sample(shapes) is not None else "random"

    def sample_shapes(self, profile: ShapeProfile) -> list[dict[str, Shape]]:
        """The distinct shapes of the samples that ``profile`` accepts, in order."""
        out: list[dict[str, Shape]] = []
        for sample in self.samples:
            shapes = shapes_of(sample)
            if profile.accepts(shapes) and shapes not in out:
                out.append(shapes)
        return out

    def poison(self, shapes: Mapping[str, Shape], turn: int) -> Arrays:
        """The ``turn``-th (0 or 1) poison feed: constant floats of opposite signs, other random ints."""
        rng = np.random.default_rng(_SEED + 1 + turn)
        feed = random_inputs(self.specs, shapes, rng)
        for spec in self.specs:
            if feed[spec.name].dtype.kind == "f":
                feed[spec.name] = np.full_like(feed[spec.name], _POISON[turn % 2])
        return feed


def user_inputs(specs: Sequence[TensorSpec], config: BuildConfig) -> Inputs:
    """``--sample-inputs`` first, else the first calibration samples, else none (random everywhere).

    Raises:
        InputError / CalibrationError (StreamRTError): the user's data cannot be read or does not
            match the inputs, as the accuracy gate would say.
    """
    specs = tuple(specs)
    if config.sample_inputs is not None:
        from streamrt.running.inputs import load_inputs

        return Inputs(specs, (load_inputs(config.sample_inputs, specs),), f"sample inputs {config.sample_inputs.name}")
    if config.calibration is not None and Path(config.calibration.data).exists():
        from streamrt.onnx.calibration import CalibrationDataset

        data = CalibrationDataset.from_config(config.calibration, specs)
        samples = tuple(data.load(i) for i in range(min(len(data), _MAX_SAMPLES)))
        return Inputs(specs, samples, f"calibration data {Path(config.calibration.data).name}")
    return Inputs(specs)
