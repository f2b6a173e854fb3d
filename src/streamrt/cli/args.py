"""Argument groups: each config's flags declared once, with their field and help, and read back.

In the manner of Polygraphy's ``tools/args``: a subcommand adds the groups it needs
(``BuildArgs().add_to(parser)``) and asks each group for its config (``BuildArgs().config(args)``).
An :class:`Option` ties the flag spellings, the config field it fills, its help and how the
flag's text becomes the field's value; the group derives the argparse destination, so no
subcommand builds attribute names from strings. A group made with a ``prefix`` adds per-side
copies of some of its options (``compare`` has ``--a-precision`` and ``--b-precision``) and lays
them over the shared ones.

Example:
    >>> import argparse
    >>> parser = argparse.ArgumentParser()
    >>> PipelineArgs().add_to(parser)
    >>> PipelineArgs().config(parser.parse_args(["--workers", "2", "--ring", "3"])).in_flight
    6
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from streamrt.config import BuildConfig, CalibrationConfig, CalibrationMethod, ImagePreprocess, Precision
from streamrt.errors import ConfigError
from streamrt.pipeline.config import PipelineConfig, Topology
from streamrt.serve.config import ServerConfig

__all__ = [
    "GRAPHS_OPTION",
    "BuildArgs",
    "CacheArgs",
    "DeprecatedAlias",
    "Option",
    "OptionGroup",
    "PipelineArgs",
    "ServerArgs",
    "add_alias",
    "add_frame_size",
    "backend_choices",
    "frame_size",
    "parse_options",
    "plain_text",
]


def plain_text(doc: str | None) -> str:
    """A docstring as plain help text: RST double backticks and roles removed."""
    text = re.sub(r":\w+:`~?([^`]+)`", r"\1", doc or "")
    return text.replace("``", "")


def backend_choices() -> list[str]:
    """Every registered backend name (whether its library is installed or not)."""
    from streamrt.backends import BACKENDS

    return list(BACKENDS)


class DeprecatedAlias(argparse.Action):
    """An old spelling that still works: stores into the new option's destination, with a note."""

    def __init__(self, option_strings: Sequence[str], dest: str, *, new: str, **kwargs: Any) -> None:
        self.new = new
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        print(f"{parser.prog}: note: {option_string} is deprecated; use {self.new}", file=sys.stderr)
        setattr(namespace, self.dest, values)


def add_alias(parser: argparse.ArgumentParser | Any, old: str, action: argparse.Action, *,
              note: bool = True) -> None:
    """Accept ``old`` as a hidden spelling of ``action`` (``--out`` for ``-o/--output``).

    Using it prints one deprecation note naming the new spelling (docs/cli.md lists the old
    spellings), so a script keeps working and its author learns the new flag; ``note=False`` is
    for spellings that are not deprecated, only hidden.
    """
    kwargs: dict[str, Any] = {"dest": action.dest, "help": argparse.SUPPRESS, "default": argparse.SUPPRESS}
    if action.type is not None:
        kwargs["type"] = action.type
    if note:
        parser.add_argument(old, action=DeprecatedAlias, new=action.option_strings[-1], **kwargs)
    else:
        parser.add_argument(old, **kwargs)


def frame_size(text: str) -> tuple[int, int]:
    """``--frame-size WxH`` (width first, as in 1280x720) -> ``(width, height)``; every command spells it so."""
    try:
        w, h = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be WxH, e.g. 1280x720, got {text!r}") from None
    if w < 1 or h < 1:
        raise argparse.ArgumentTypeError(f"must be WxH with both sizes >= 1, got {text!r}")
    return (w, h)


def add_frame_size(parser: argparse.ArgumentParser | Any, default: str) -> argparse.Action:
    """The shared ``--frame-size WxH`` flag (``demo``, ``pipeline-bench``); ``default`` is said in its help."""
    return parser.add_argument("--frame-size", type=frame_size, default=None, metavar="WxH",
                               help=f"frame width x height (default {default})")


@dataclass(frozen=True)
class Option:
    """One flag: its spellings, the config field it fills, its help and argparse settings.

    ``value`` turns what argparse parsed into the field's value (``--no-keep-io-types`` -> False);
    a flag that was not given leaves the field alone (its default is None in argparse).
    """

    field: str
    flags: tuple[str, ...]
    help: str
    kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    value: Callable[[Any], Any] = lambda v: v
    per_side: bool = False  # copied as --<prefix>flag by prefixed groups

    def spellings(self, prefix: str) -> list[str]:
        return [f"--{prefix}{f[2:]}" for f in self.flags if f.startswith("--")] if prefix else list(self.flags)


@dataclass
class OptionGroup:
    """Options of one config, added to a parser and read back as that config's fields."""

    title: str = ""
    prefix: str = ""
    options: tuple[Option, ...] = ()
    namespace: str = ""  # keeps the destinations of groups sharing a field name apart

    def _dest(self, option: Option) -> str:
        return f"{self.namespace}{self.prefix}{option.field}".replace("-", "_")

    def _active(self) -> tuple[Option, ...]:
        return tuple(o for o in self.options if o.per_side or not self.prefix)

    def add_to(self, parser: argparse.ArgumentParser, group: Any = None) -> Any:
        """Add the options to ``group`` (default: a new argument group titled after this one)."""
        side = f" ({self.prefix.rstrip('-')})" if self.prefix else ""
        group = group if group is not None else parser.add_argument_group(f"{self.title}{side}")
        for option in self._active():
            kwargs = {"default": None, **option.kwargs}
            if "action" not in kwargs and "choices" not in kwargs and "metavar" not in kwargs:
                kwargs["metavar"] = option.flags[-1].lstrip("-").upper().replace("-", "_")  # not the field name
            help_text = option.help
            if self.prefix:
                help_text += f"; for {self.prefix.rstrip('-').upper()} only (overrides the shared flag)"
            group.add_argument(*option.spellings(self.prefix), dest=self._dest(option), help=help_text, **kwargs)
        return group

    def given(self, args: argparse.Namespace) -> dict[str, Any]:
        """The fields whose flags were given, as config values."""
        values = vars(args)
        out = {}
        for option in self._active():
            raw = values.get(self._dest(option))
            if raw is not None:
                out[option.field] = option.value(raw)
        return out


# --- build ---------------------------------------------------------------------------------------


def parse_options(items: list[str]) -> dict[str, Any]:
    """``['threads=4', 'providers=["cuda"]']`` -> ``{'threads': 4, 'providers': ['cuda']}``."""
    options: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"bad --option {item!r}: expected KEY=VALUE")
        try:
            options[key] = json.loads(value)
        except ValueError:
            options[key] = value
    return options


def _floats(name: str) -> Callable[[str], tuple[float, float, float]]:
    def parse(text: str) -> tuple[float, float, float]:
        try:
            a, b, c = (float(v) for v in text.split(","))
        except ValueError:
            raise ConfigError(f"{name} must be three comma-separated numbers, got {text!r}") from None
        return (a, b, c)

    return parse


def _size(text: str) -> tuple[int, int]:
    try:
        h, w = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise ConfigError(f"--calib-size must be HxW, got {text!r}") from None
    return (h, w)


def _ops(text: str) -> tuple[str, ...]:
    return tuple(op.strip() for op in text.split(",") if op.strip())


_PRECISIONS = [p.value for p in Precision]

BUILD_OPTIONS = (
    Option("backend", ("--backend",), "backend (default onnxruntime)", {"choices": backend_choices()},
           per_side=True),
    Option("precision", ("--precision",), "numeric precision, applied to the ONNX graph (default fp32)",
           {"choices": _PRECISIONS}, per_side=True),
    Option("optimization_level", ("--optimization-level", "--opt-level"), "0 (fastest build) .. 5 (slowest build, "
           "fastest kernels), TensorRT's levels; default 3 (docs/optimization-levels.md)",
           {"type": int, "choices": range(6), "metavar": "{0..5}"}),
    Option("tf32", ("--tf32",), "fp32 plans: allow TF32 tensor-core math in matmuls and convolutions (about 1e-3 "
           "relative error; default off: IEEE fp32)", {"action": "store_true"}),
    Option("timing_cache", ("--timing-cache",), "keep kernel timings across builds here and reuse them (like "
           "trtexec --timingCacheFile): a file for tensorrt, a directory for torch_inductor",
           {"type": Path, "metavar": "PATH"}),
    Option("build_budget_s", ("--build-budget-s",), "seconds the autotuning of one build may take (torch_inductor "
           "levels 4-5; default 300): past it the rest is compiled without autotuning, and the build says so; "
           "0: no limit", {"type": float, "metavar": "SECONDS"}, value=lambda v: None if v == 0 else v),
    Option("memory_limit_mb", ("--memory-limit",), "workspace/arena limit", {"type": int, "metavar": "MB"}),
    Option("keep_io_types", ("--no-keep-io-types",), "fp16/bf16: convert inputs/outputs too (default keeps them fp32)",
           {"action": "store_true"}, value=lambda _: False),
    Option("fp32_ops", ("--fp32-ops",), "comma-separated op types kept in fp32", {"metavar": "OPS"}, value=_ops),
    Option("backend_options", ("--option",), 'backend option (e.g. threads=4, providers=["cuda"]); repeatable',
           {"action": "append", "metavar": "KEY=VALUE"}, value=parse_options),
    Option("verify_shapes", ("--verify-shapes",),
           "run the plan at each profile's min/opt/max and an odd size against ONNX Runtime fp32 and refuse a "
           "mismatch (default: on for every backend but onnxruntime)", {"action": argparse.BooleanOptionalAction}),
    # fp16/bf16/int8 accuracy (streamrt.accuracy_gate): sample data, the gate, int8's sensitivity target
    Option("sample_inputs", ("--sample-inputs",), "real inputs (keyed by input name) for fp16 range checks and "
           "the accuracy gate (default: calibration data, else random inputs)", {"type": Path, "metavar": "FILE.npz"}),
    Option("accuracy_threshold", ("--accuracy-threshold",), "fail the fp16/bf16/int8 build when the plan misses it "
           "vs onnxruntime fp32: cosine=0.999, top1=0.99, rel_l2=0.01, max_abs=..., rel_p99=... (comma-separated; "
           "a bare number is a min cosine)", {"metavar": "SPEC"}),
    Option("int8_target", ("--int8-target",), "int8: keep the most sensitive quantized layers in fp32 until this "
           "is met (e.g. top1=0.99)", {"metavar": "SPEC"}),
    Option("speed_check", ("--no-speed-check",), "int8: skip timing the plan against an fp32 plan of the same "
           "backend (a second build)", {"action": "store_true"}, value=lambda _: False),
)
"""BuildConfig fields set by one flag each; profiles and calibration are read by BuildArgs itself."""

SHAPE_OPTIONS = (
    Option("min", ("--min-shapes",), "name:1x3x224x224,... minimum shapes of one profile (repeat per profile)",
           {"action": "append", "metavar": "SPECS"}),
    Option("opt", ("--opt-shapes",), "shapes kernels are tuned for (default: the min shapes)",
           {"action": "append", "metavar": "SPECS"}),
    Option("max", ("--max-shapes",), "maximum shapes", {"action": "append", "metavar": "SPECS"}),
    Option("multiple", ("--shape-multiple",), "name:1x1x32x32,... each dimension must be a multiple of this "
           "(checked at build and run; once for all profiles or once per profile)",
           {"action": "append", "metavar": "SPECS"}),
)

CALIBRATION_OPTIONS = (
    Option("data", ("--calib",), "int8 calibration data: a folder of .npy/.npz files or images",
           {"type": Path, "metavar": "DIR"}),
    Option("method", ("--calib-method",), "how activation ranges are chosen (default entropy)",
           {"choices": [m.value for m in CalibrationMethod]}, value=CalibrationMethod),
    Option("max_samples", ("--calib-samples",), "use at most N calibration samples", {"type": int, "metavar": "N"}),
    Option("per_channel", ("--per-tensor",), "int8: per-tensor weight scales", {"action": "store_true"},
           value=lambda _: False),
)

PREPROCESS_OPTIONS = (
    Option("size", ("--calib-size",), "image calibration: resize to HxW (default 224x224)", {"metavar": "HxW"},
           value=_size),
    Option("mean", ("--calib-mean",), "image calibration: mean in [0, 1] units", {"metavar": "R,G,B"},
           value=_floats("--calib-mean")),
    Option("std", ("--calib-std",), "image calibration: std in [0, 1] units", {"metavar": "R,G,B"},
           value=_floats("--calib-std")),
)


class BuildArgs:
    """The flags of :class:`BuildConfig` (``--config FILE`` first, flags given override it).

    ``BuildArgs(prefix="a-")`` adds only ``--a-backend`` and ``--a-precision``; its :meth:`config`
    takes the shared config and lays the side's flags over it.
    """

    def __init__(self, prefix: str = "") -> None:
        self.prefix = prefix
        self.build = OptionGroup("build options", prefix, BUILD_OPTIONS)
        self.shapes = OptionGroup(options=SHAPE_OPTIONS, namespace="shapes_")
        self.calibration = OptionGroup(options=CALIBRATION_OPTIONS, namespace="calibration_")
        self.preprocess = OptionGroup(options=PREPROCESS_OPTIONS, namespace="preprocess_")

    def add_to(self, parser: argparse.ArgumentParser) -> None:
        group = self.build.add_to(parser)
        if self.prefix:
            return
        group.add_argument("--config", type=Path, help="YAML/JSON file with BuildConfig fields; flags override it")
        for sub in (self.shapes, self.calibration, self.preprocess):
            sub.add_to(parser, group)

    def config(self, args: argparse.Namespace, base: BuildConfig | None = None) -> BuildConfig:
        """The BuildConfig the flags describe: ``base`` (or ``--config``, or the defaults) with the flags given."""
        if self.prefix:
            shared = base if base is not None else BuildArgs().config(args)
            return dataclasses.replace(shared, **self.build.given(args))
        if base is None:
            path = vars(args).get("config")
            base = BuildConfig.from_file(path) if path else BuildConfig()
        changes = self.build.given(args)
        if "backend_options" in changes:
            changes["backend_options"] = {**base.backend_options, **changes["backend_options"]}
        shapes = self.shapes.given(args)
        if shapes:
            from streamrt.onnx.profiles import parse_profiles

            changes["profiles"] = parse_profiles(
                shapes.get("min", []), shapes.get("opt", []), shapes.get("max", []), shapes.get("multiple", [])
            )
        calibration = self.calibration.given(args)
        if "data" in calibration:
            preprocess = self.preprocess.given(args)
            changes["calibration"] = CalibrationConfig(
                **calibration, preprocess=ImagePreprocess(**preprocess) if preprocess else None
            )
        return dataclasses.replace(base, **changes)


class CacheArgs:
    """``--no-cache`` and ``--cache-dir``: whether and where builds are reused."""

    def add_to(self, parser: argparse.ArgumentParser, group: Any = None) -> None:
        group = group if group is not None else parser.add_argument_group("build cache")
        group.add_argument("--no-cache", action="store_true", help="always build; do not reuse or store plans")
        group.add_argument("--cache-dir", type=Path, default=None, help="build cache (default ~/.cache/streamrt)")

    @staticmethod
    def use_cache(args: argparse.Namespace) -> bool:
        return not vars(args).get("no_cache", False)

    @staticmethod
    def cache_dir(args: argparse.Namespace) -> Path | None:
        value = vars(args).get("cache_dir")
        return Path(value) if value is not None else None


# --- pipeline ------------------------------------------------------------------------------------

DEVICE_OPTION = Option("device", ("--device",), "where to run: auto (CUDA when there is one), cuda or cpu",
                       {"choices": ("auto", "cuda", "cpu")})

GRAPHS_OPTION = Option("cuda_graphs", ("--graphs",), "replay graphable stages as CUDA graphs, or never "
                       "(--no-graphs); CUDA only, the CPU runs without", {"action": argparse.BooleanOptionalAction})
"""``--graphs/--no-graphs``, the same in every command (pipeline-bench adds ``--compare-graphs``)."""

PIPELINE_OPTIONS = (
    Option("topology", ("--topology",),
           "sync: the synchronous loop; streams: a stream per stage; single: one stream per lane",
           {"choices": [t.value for t in Topology]}),
    Option("workers", ("--workers",), "replicated lanes, each with its own streams and engine context",
           {"type": int, "metavar": "N"}),
    Option("ring_size", ("--ring",), "items in flight per lane", {"type": int, "metavar": "N"}),
    GRAPHS_OPTION,
)
"""PipelineConfig fields with a flag (its ``device`` follows the engine in detect and demo)."""


class PipelineArgs:
    """The flags of :class:`PipelineConfig`; ``skip`` leaves some out (a command that fixes them)."""

    def __init__(self, skip: tuple[str, ...] = (), defaults: Mapping[str, Any] | None = None) -> None:
        self.group = OptionGroup("pipeline", options=tuple(o for o in PIPELINE_OPTIONS if o.field not in skip))
        self.defaults = dict(defaults or {})

    def add_to(self, parser: argparse.ArgumentParser) -> None:
        self.group.add_to(parser)

    def config(self, args: argparse.Namespace, base: PipelineConfig | None = None) -> PipelineConfig:
        """``base`` (or the defaults given to the group) with the flags given."""
        start = base if base is not None else PipelineConfig(**self.defaults)
        return dataclasses.replace(start, **self.group.given(args))


# --- server --------------------------------------------------------------------------------------


_OFF = "off"


def _port(text: str) -> int | str:
    value = int(text)
    return _OFF if value < 0 else value


def _port_value(value: int | str) -> int | None:
    return None if value == _OFF else int(value)


SERVER_OPTIONS = (
    Option("host", ("--host",), "address to bind (default 127.0.0.1: this machine only)"),
    Option("http_port", ("--http-port",), "HTTP port (default 8000; 0: any free port; -1: off)",
           {"type": _port, "metavar": "N"}, value=_port_value),
    Option("grpc_port", ("--grpc-port",), "gRPC port (default 8001; 0: any free port; -1: off)",
           {"type": _port, "metavar": "N"}, value=_port_value),
    Option("metrics_port", ("--metrics-port",), "Prometheus /metrics port (default 8002; 0: any free port; -1: off)",
           {"type": _port, "metavar": "N"}, value=_port_value),
    Option("startup_models", ("--model",), "load only these models at start (repeatable; default: all)",
           {"action": "append", "metavar": "NAME"}, value=tuple),
    Option("model_control", ("--no-model-control",), "refuse load/unload requests", {"action": "store_true"},
           value=lambda _: False),
    Option("strict_readiness", ("--no-strict-readiness",),
           "ready as soon as the server is up, even while models load or failed", {"action": "store_true"},
           value=lambda _: False),
    Option("load_threads", ("--load-threads",), "models loaded in parallel (default 2)", {"type": int}),
    Option("auth_token", ("--auth-token",),
           "require 'Authorization: Bearer TOKEN' (default: $STREAMRT_SERVE_TOKEN when set)"),
    Option("max_request_bytes", ("--max-request-bytes",), "largest HTTP request body (default 64 MiB)",
           {"type": int}),
    Option("grpc_max_message_bytes", ("--grpc-max-message-mb",),
           "largest gRPC message in MiB (default 512: a 64-image fp32 224x224 request is 38.5 MB; "
           "gRPC answers RESOURCE_EXHAUSTED above it)", {"type": float, "metavar": "MB"},
           value=lambda mb: int(mb * 2**20)),
    Option("max_tensor_elements", ("--max-tensor-elements",), "largest element count of one input (default 2^24)",
           {"type": int}),
    Option("trace_file", ("--trace-file",), "append one JSON line per traced request to PATH (Triton's trace "
           "timestamps: received, queued, compute start/end, response); default: no tracing", {"metavar": "PATH"}),
    Option("trace_rate", ("--trace-rate",), "trace one request in N (default 1: all, when --trace-file or "
           "--trace-otlp-url is given)", {"type": int, "metavar": "N"}),
    Option("trace_otlp_url", ("--trace-otlp-url",), "send each traced request as OpenTelemetry spans to this "
           "OTLP/HTTP endpoint, e.g. http://localhost:4318/v1/traces (needs the otel extra); a W3C traceparent "
           "header joins the caller's trace", {"metavar": "URL"}),
    Option("frontend_processes", ("--frontend-processes",),
           "HTTP/gRPC front-end processes sharing the ports (default 1: in the engine process); N > 1 for "
           "request rates one Python process cannot parse, see docs/serving-frontends.md",
           {"type": int, "metavar": "N"}),
    Option("frontend_arena_bytes", ("--frontend-arena-mb",),
           "shared memory per front-end process for tensors in flight (default 1024; pages are used "
           "only as tensors arrive)",
           {"type": float, "metavar": "MB"}, value=lambda mb: int(mb * 2**20)),
    Option("exit_timeout_s", ("--exit-timeout",), "shutdown waits this long for in-flight requests (default 30)",
           {"type": float, "metavar": "S"}),
    # sharing one GPU between models (streamrt.serve.rate_limiter, streamrt.serve.memory_budget)
    Option("rate_limit", ("--rate-limit",), "off (default): instances run as soon as they have a batch; "
           "execution_count: each execution first takes its instance group's rate_limiter resources, and "
           "waiting instances go by rate_limiter priority (Triton's --rate-limit)",
           {"choices": ("off", "execution_count")}),
    Option("rate_limit_resources", ("--rate-limit-resource",), "copies of a rate limiter resource, NAME:COUNT "
           "(every device) or NAME:COUNT:DEVICE (repeatable; default: the largest count any instance asks for; "
           "once given, every resource the models use must be given)",
           {"action": "append", "metavar": "NAME:COUNT[:DEVICE]"}, value=tuple),
    Option("gpu_memory_budget_mb", ("--gpu-memory-budget-mb",), "GPU memory all loaded models may take together, "
           "in MiB; a model that would exceed it (or the GPU's free memory) is refused at load (default: free "
           "memory only)", {"type": float, "metavar": "MB"}),
)


class ServerArgs:
    """The flags of :class:`ServerConfig`."""

    def __init__(self) -> None:
        self.group = OptionGroup("server", options=SERVER_OPTIONS)

    def add_to(self, parser: argparse.ArgumentParser) -> None:
        self.group.add_to(parser)

    def config(self, args: argparse.Namespace) -> ServerConfig:
        changes = self.group.given(args)
        token = changes.get("auth_token") or os.environ.get("STREAMRT_SERVE_TOKEN") or None
        changes["auth_token"] = token
        return ServerConfig(**changes)
