"""Convolution epilogues fused by cuDNN: the ``conv_epilogues`` build option (issue 28).

On the H200 (2026-12-03) level 5's ResNet-50 spent 35% of its GPU time in pointwise kernels: the
bias, residual-add and ReLU epilogues of the convolutions Inductor leaves to cuDNN, each one a
separate Triton kernel that reads and writes the whole activation again. cuDNN can run them inside
the convolution (its runtime-fusion engines, reached through ATen's
``cudnn_convolution_relu(x, w, bias)`` = ``relu(conv(x, w) + bias)`` and
``cudnn_convolution_add_relu(x, w, z, alpha, bias)`` = ``relu(conv(x, w) + alpha * z + bias)``,
the ops ``torch.jit.freeze`` fuses into on CUDA). This module is an Inductor post-grad graph pass
that rewrites those patterns into the two ops before lowering; Inductor runs them as extern
kernels (AOTInductor's proxy executor calls them through the C++ dispatcher: no Python at run
time), and the ops choose cuDNN's memory format themselves (channels-last when the input or the
weight is).

Modes (``--option conv_epilogues=...``):

* ``inductor`` (default): nothing rewritten; Inductor fuses the epilogues into its own kernels.
* ``cudnn``: every eligible convolution.
* ``cudnn_spatial``: only convolutions with a kernel larger than 1x1, the ones Inductor cannot
  turn into GEMMs (whose epilogues its Triton GEMM templates can fuse at levels 4-5).

The fused ops' 4-D operands (input, weight, residual) are required channels-last while they are
lowered (:func:`installed` adds an Inductor layout constraint for the two ops): without it, an
operand made by an Inductor kernel (the stem's max-pool) is laid out contiguous, as Inductor lays
out every input of an op it knows nothing about, and cuDNN converts it to NHWC and back in kernels
of its own on every call. On the H200 (2026-12-04, ResNet-50 fp16 batch 32,
level 3) the constraint and the moved shortcut biases took the plan from 25,792 to 28,187 images/s.

Tried and dropped: padding the 3-channel stem to 8 zero channels so cuDNN fuses it too (all but 3
of the plan's kernels then cuDNN's) ran at 24,547 images/s, 0.87x, in the same run: cuDNN's 8-channel
7x7 convolution is slower than its dedicated first-layer kernel plus Inductor's bias/ReLU/max-pool.

Eligible: a 2-D, not transposed, ``groups == 1`` convolution on CUDA in fp16, bf16 or fp32 whose
input and output channels are multiples of 8 (cuDNN's fused engines need aligned channels; the
3-channel stem is left alone), whose only user is the ReLU (or the add feeding it, with the other
operand of the same shape and dtype). Batch norm must be folded first for the pattern to appear:
that is freezing (level 5, or ``--option freezing=true``); ONNX graphs usually have it folded.

Only the build imports this module (:func:`installed` around the compile); the ops' fake
(shape-only) implementations are registered here, once, because ATen has none.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import logging
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, TypeGuard, cast

import torch
import torch.fx
from torch._inductor.custom_graph_pass import CustomGraphPass, get_hash_for_files

__all__ = ["CudnnConvEpilogues", "fused_in_package", "installed", "register_fake_impls"]

log = logging.getLogger(__name__)

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _suggested_format(t: torch.Tensor) -> torch.memory_format:
    from torch._prims_common import suggest_memory_format

    return suggest_memory_format(t)


def _conv_like(x: torch.Tensor, weight: torch.Tensor, stride: list[int], padding: list[int],
               dilation: list[int]) -> torch.Tensor:
    """The output ATen's cuDNN convolution ops allocate: conv shape, channels-last if the input or weight is."""
    sizes = [x.shape[0], weight.shape[0]]
    for i in range(x.dim() - 2):
        k = dilation[i] * (weight.shape[i + 2] - 1) + 1
        sizes.append((x.shape[i + 2] + 2 * padding[i] - k) // stride[i] + 1)
    channels_last = x.dim() == 4 and torch.channels_last in (_suggested_format(x), _suggested_format(weight))
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    return torch.empty(sizes, dtype=x.dtype, device=x.device, memory_format=fmt)


@functools.cache
def register_fake_impls() -> None:
    """Shape-only implementations of the two ATen ops, for export and Inductor's fake tensors (once)."""
    for name, fake in (("aten::cudnn_convolution_relu", _fake_conv_relu),
                       ("aten::cudnn_convolution_add_relu", _fake_conv_add_relu)):
        if torch._C._dispatch_has_kernel_for_dispatch_key(name, "Meta"):
            continue  # a torch that has one already
        try:
            torch.library.register_fake(name)(fake)
        except RuntimeError as exc:  # registered by an earlier import under another name
            log.debug("fake impl of %s not registered: %s", name, exc)


def _fake_conv_relu(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, stride: list[int],
                    padding: list[int], dilation: list[int], groups: int) -> torch.Tensor:
    return _conv_like(x, weight, stride, padding, dilation)


def _fake_conv_add_relu(x: torch.Tensor, weight: torch.Tensor, z: torch.Tensor, alpha: Any,
                        bias: torch.Tensor | None, stride: list[int], padding: list[int], dilation: list[int],
                        groups: int) -> torch.Tensor:
    return _conv_like(x, weight, stride, padding, dilation)


def _val(node: Any) -> torch.Tensor | None:
    val = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return val if isinstance(val, torch.Tensor) else None


@dataclass
class CudnnConvEpilogues(CustomGraphPass):
    """The post-grad pass (an Inductor ``CustomGraphPass``): ReLU epilogues into cuDNN's fused convolutions.

    ``devices`` are the device types whose convolutions are rewritten (tests use ``cpu`` with
    reference kernels registered for the two ops); ``fused`` counts what the last call rewrote.

    Example::

        with torch._inductor.config.patch(post_grad_custom_post_pass=CudnnConvEpilogues("cudnn")):
            aoti_compile_and_package(ep)
    """

    mode: str = "cudnn"
    devices: tuple[str, ...] = ("cuda",)
    fused: dict[str, int] = field(default_factory=dict)
    shortcut_biases: int = 0

    def uuid(self) -> Any:
        return (self.mode, self.devices, get_hash_for_files((__file__,)))

    def __call__(self, graph: torch.fx.Graph) -> None:
        aten = torch.ops.aten
        self.fused = {"conv_relu": 0, "conv_add_relu": 0}
        self.shortcut_biases = 0
        for relu in list(graph.nodes):
            if relu.op != "call_function" or relu.target is not aten.relu.default:
                continue
            src = relu.args[0]
            if self._eligible(src):
                self._replace(graph, relu, aten.cudnn_convolution_relu.default, src, None)
                self.fused["conv_relu"] += 1
            elif (isinstance(src, torch.fx.Node) and src.target is aten.add.Tensor and len(src.users) == 1
                  and not src.kwargs and len(src.args) == 2):
                for conv, z in (src.args, src.args[::-1]):
                    if self._eligible(conv) and self._same_tensor_shape(conv, z):
                        z, bias = _shortcut_bias_moved(graph, relu, conv, z)
                        self._replace(graph, relu, aten.cudnn_convolution_add_relu.default, conv, z, bias)
                        self.fused["conv_add_relu"] += 1
                        self.shortcut_biases += bias is not conv.args[2]
                        break
        graph.eliminate_dead_code()
        log.info("cuDNN convolution epilogues (%s): %d conv+ReLU, %d conv+add+ReLU (%d shortcut biases moved)",
                 self.mode, self.fused["conv_relu"], self.fused["conv_add_relu"], self.shortcut_biases)

    def _eligible(self, conv: Any) -> TypeGuard[torch.fx.Node]:
        if not isinstance(conv, torch.fx.Node) or conv.target is not torch.ops.aten.convolution.default:
            return False
        if len(conv.users) != 1 or len(conv.args) != 9:
            return False
        x, w, _bias, _stride, _padding, _dilation, transposed, _output_padding, groups = conv.args
        xv, wv, out = _val(x), _val(w), _val(conv)
        if xv is None or wv is None or out is None or transposed or groups != 1 or wv.dim() != 4:
            return False
        if xv.device.type not in self.devices or xv.dtype not in _DTYPES or wv.dtype != xv.dtype:
            return False
        channels_in, channels_out = wv.shape[1], wv.shape[0]
        if not (isinstance(channels_in, int) and isinstance(channels_out, int)):
            return False
        if channels_in % 8 or channels_out % 8:
            return False
        return not (self.mode == "cudnn_spatial" and tuple(wv.shape[2:]) == (1, 1))

    @staticmethod
    def _same_tensor_shape(conv: torch.fx.Node, z: Any) -> bool:
        out, zv = _val(conv), _val(z)
        return zv is not None and out is not None and zv.dtype == out.dtype and tuple(zv.shape) == tuple(out.shape)

    @staticmethod
    def _replace(graph: torch.fx.Graph, relu: torch.fx.Node, op: Any, conv: torch.fx.Node, z: Any,
                 bias: Any = None) -> None:
        x, w, conv_bias, stride, padding, dilation, _t, _op, groups = cast(tuple[Any, ...], conv.args)
        bias = conv_bias if z is None else bias
        args = (x, w, bias, stride, padding, dilation, groups) if z is None else \
            (x, w, z, None, bias, stride, padding, dilation, groups)
        with graph.inserting_before(relu):
            fused = graph.call_function(op, args)
        fused.meta.update(conv.meta)
        _channels_last_weight(graph, w)
        xv, wv = _val(x), _val(w)
        assert xv is not None and wv is not None
        with contextlib.ExitStack() as stack:
            mode = getattr(xv, "fake_mode", None)
            if mode is not None:
                stack.enter_context(mode)
            fused.meta["val"] = _conv_like(xv, wv, list(stride), list(padding), list(dilation))
        relu.replace_all_uses_with(fused)
        graph.erase_node(relu)  # the convolution (and add) it read go with eliminate_dead_code


def _shortcut_bias_moved(graph: torch.fx.Graph, relu: torch.fx.Node, conv: torch.fx.Node, z: Any) -> tuple[Any, Any]:
    """``z`` and the fused op's bias, with a shortcut convolution's bias moved into the fused op.

    ResNet's projection shortcut ``z = conv(x, w_ds) + b_ds`` (batch norm folded) costs a pointwise
    kernel of its own: Inductor peels a CUDA convolution's bias off into a Triton add (its lowering
    says cuDNN is slower with it). ``relu(conv(y) + b + z)`` equals ``relu(conv(y) + (b + b_ds) +
    conv(x, w_ds))``, so the shortcut runs without a bias and the fused op adds both. Constant biases
    (freezing) are summed at build time (in fp32); others by one small add in the graph.
    """
    bias = conv.args[2]
    if not isinstance(z, torch.fx.Node) or z.target is not torch.ops.aten.convolution.default or \
            len(z.users) != 1 or len(z.args) != 9 or not isinstance(z.args[2], torch.fx.Node):
        return z, bias
    z_bias = z.args[2]
    with graph.inserting_before(relu):
        bare = graph.call_function(torch.ops.aten.convolution.default, (*z.args[:2], None, *z.args[3:]))
        bare.meta.update(z.meta)
        summed = z_bias if bias is None else _summed_constant(graph, bias, z_bias)
        if summed is None:
            summed = graph.call_function(torch.ops.aten.add.Tensor, (bias, z_bias))
            val, other = _val(bias), _val(z_bias)
            mode = getattr(val, "fake_mode", None)
            if val is not None and other is not None and mode is not None:
                with mode:
                    summed.meta["val"] = val + other
    return bare, summed


def _summed_constant(graph: torch.fx.Graph, a: Any, b: Any) -> torch.fx.Node | None:
    """A new constant ``a + b`` (summed in fp32) when both are constants of the graph module; else None."""
    gm = graph.owning_module
    if gm is None or not all(isinstance(n, torch.fx.Node) and n.op == "get_attr" and "." not in str(n.target)
                             for n in (a, b)):
        return None
    ta, tb = getattr(gm, str(a.target), None), getattr(gm, str(b.target), None)
    if not isinstance(ta, torch.Tensor) or not isinstance(tb, torch.Tensor) or ta.shape != tb.shape:
        return None
    name = f"_streamrt_shortcut_bias_{a.target}_{b.target}"
    gm.register_buffer(name, (ta.float() + tb.float()).to(ta.dtype))
    node = graph.get_attr(name)
    val = _val(a)
    mode = getattr(val, "fake_mode", None)
    if val is not None and mode is not None:
        with mode:
            node.meta["val"] = torch.empty_like(val)
    return node


def _channels_last_weight(graph: torch.fx.Graph, weight: Any) -> None:
    """Store a constant weight channels-last, so cuDNN's ops choose channels-last (NHWC tensor-core kernels).

    The ops follow the input's or the weight's memory format; Inductor decides its layout
    optimization from the convolutions it still sees, and after this pass it sees few, so the
    inputs may arrive contiguous. A weight that is not a constant of the graph is left as it is.
    """
    gm = graph.owning_module
    if gm is None or weight.op != "get_attr" or "." in str(weight.target):
        return
    tensor = getattr(gm, str(weight.target), None)
    if not isinstance(tensor, torch.Tensor) or tensor.dim() != 4 or \
            tensor.is_contiguous(memory_format=torch.channels_last):
        return
    setattr(gm, str(weight.target), tensor.contiguous(memory_format=torch.channels_last))
    val = _val(weight)
    mode = getattr(val, "fake_mode", None)
    if val is not None and mode is not None:
        with mode:
            weight.meta["val"] = val.contiguous(memory_format=torch.channels_last)


@contextlib.contextmanager
def installed(mode: str, devices: tuple[str, ...] = ("cuda",)) -> Iterator[CudnnConvEpilogues | None]:
    """Inductor's post-grad custom pass set to the ``mode`` rewrite while compiling (nothing for ``inductor``)."""
    if mode == "inductor":
        yield None
        return
    import torch._inductor.config as inductor_config

    register_fake_impls()
    rewrite = CudnnConvEpilogues(mode, devices)
    with inductor_config.patch(post_grad_custom_post_pass=rewrite), _channels_last_operands():
        yield rewrite


def _require_channels_last(fx_node: Any, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
    """Inductor layout constraint: every 4-D tensor operand channels-last (a copy where it is not)."""
    from torch._inductor import ir

    not_tensors = tuple(getattr(ir, name) for name in ("NonTensorObj", "OpaqueMultiOutput", "ShapeAsConstantBuffer")
                        if hasattr(ir, name))

    def fix(arg: Any) -> Any:
        if not isinstance(arg, ir.IRNode) or isinstance(arg, not_tensors):
            return arg
        try:
            four_d = len(arg.get_size()) == 4
        except NotImplementedError:  # an IR node without a size is no tensor operand
            return arg
        return ir.ExternKernel.require_channels_last(arg) if four_d else arg

    return tuple(fix(a) for a in args), {k: fix(v) for k, v in kwargs.items()}


@contextlib.contextmanager
def _channels_last_operands() -> Iterator[None]:
    """The fused ops' 4-D operands laid out channels-last by Inductor while compiling (restored after).

    Inductor gives an op without a lowering of its own whatever layout its operands have, and an
    operand it makes itself (a max-pool) contiguous; cuDNN would convert those to NHWC in kernels of
    its own on every call."""
    from torch._inductor import lowering

    ops = (torch.ops.aten.cudnn_convolution_relu.default, torch.ops.aten.cudnn_convolution_add_relu.default)
    table = getattr(lowering, "_maybe_layout_constraints", None)
    if table is None:  # a torch without the table: leave layouts to Inductor
        log.debug("Inductor has no layout-constraint table; fused operands keep Inductor's layout")
        yield
        return
    saved = {op: table[op] for op in ops if op in table}
    for op in ops:
        table[op] = _require_channels_last
    try:
        yield
    finally:
        for op in ops:
            table.pop(op, None)
        table.update(saved)


_FUSED_TARGETS = {"aten::cudnn_convolution_relu": "conv_relu", "aten::cudnn_convolution_add_relu": "conv_add_relu"}


def fused_in_package(package: bytes) -> dict[str, int]:
    """How many fused convolutions an AOTInductor ``.pt2`` calls: its proxy executor's extern-kernel nodes
    (the ``*.json`` beside the wrapper), counted by op. Works for packages compiled in a child process."""
    counts = dict.fromkeys(_FUSED_TARGETS.values(), 0)
    with zipfile.ZipFile(io.BytesIO(package)) as zf:
        for name in zf.namelist():
            if "/aotinductor/" not in name or not name.endswith(".json") or name.endswith("_metadata.json"):
                continue
            try:
                nodes = json.loads(zf.read(name)).get("nodes", [])
            except (ValueError, AttributeError):
                continue
            for node in nodes:
                key = _FUSED_TARGETS.get(str(node.get("node", {}).get("target")))
                if key:
                    counts[key] += 1
    return counts
