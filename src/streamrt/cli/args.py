"""Argument groups: each config's flags declared once, with their field and help, and read back.

In the manner of Polygraphy's ``tools/args``: a subcommand adds the groups it needs
(``BuildArgs().add_to(parser)``) and asks each group for its config (``BuildArgs().config(args)``).
An :class:`~streamrt._flags.Option` ties the flag spellings, the config field it fills, its help
and how the flag's text becomes the field's value (and back: the build flags' table lives in
:mod:`streamrt.building.flags`, where the builder writes a config back as flags); the group
derives the argparse destination, so no subcommand builds attribute names from strings. A group
made with a ``prefix`` adds per-side copies of some of its options (``compare`` has
``--a-precision`` and ``--b-precision``) and lays them over the shared ones.

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
import os
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from streamrt._flags import Option
from streamrt.building.flags import (
    BUILD_OPTIONS,
    CALIBRATION_OPTIONS,
    PREPROCESS_OPTIONS,
    SHAPE_OPTIONS,
    backend_choices,
    parse_options,
)
from streamrt.config import BuildConfig, CalibrationConfig, ImagePreprocess
from streamrt.device.cpus import format_cpu_list, parse_cpu_list
from streamrt.errors import ConfigError
from streamrt.pipeline.config import PipelineConfig, Topology
from streamrt.serve.configs.config import ServerConfig

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
# The build flags' table (BUILD_OPTIONS, SHAPE_OPTIONS, CALIBRATION_OPTIONS, PREPROCESS_OPTIONS) lives
# in streamrt.building.flags, where the builder reads it back into a rebuild command.



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
    Option("launch_thread", ("--launch-thread",), "launch the CUDA stages that follow a host stage from a "
           "thread of each lane's own, so the host stage goes on with the next item (--no-launch-thread: from "
           "the host stage's thread)", {"action": argparse.BooleanOptionalAction}),
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


def _cpu_list(text: str) -> tuple[int, ...]:
    """``--engine-cpus``: the kernel's CPU-list syntax, refused by argparse with the reason."""
    try:
        return tuple(sorted(parse_cpu_list(text)))
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


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
    Option("max_request_bytes", ("--max-request-bytes",),
           "largest HTTP request body (default 2 GiB - 1: Triton 2.51 has no HTTP body limit)", {"type": int}),
    Option("grpc_max_message_bytes", ("--grpc-max-message-mb",),
           "largest gRPC message in MiB (default 2048, capped at gRPC's 2 GiB - 1 bytes as Triton's; "
           "gRPC answers RESOURCE_EXHAUSTED above it)", {"type": float, "metavar": "MB"},
           value=lambda mb: min(int(mb * 2**20), 2**31 - 1)),
    Option("max_tensor_elements", ("--max-tensor-elements",),
           "largest element count of one input (default 2^31 - 1: Triton has no such limit)", {"type": int}),
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
    Option("grpc_server", ("--grpc-server",),
           "who serves gRPC in the engine process: grpcio (default) or h2corn, a Rust HTTP/2 server with a "
           "quarter of grpcio's CPU per request (pip install 'streamrt[fast-grpc]')",
           {"choices": ("grpcio", "h2corn")}),
    Option("http_server", ("--http-server",),
           "who serves HTTP/REST: aiohttp (default) or h2corn, the same Rust server, for the inference route "
           "(every other route still answered by the aiohttp app; pip install 'streamrt[fast-grpc]')",
           {"choices": ("aiohttp", "h2corn")}),
    Option("grpc_threads", ("--grpc-threads",),
           "h2corn's Tokio threads (default: 1 on a machine of 2 CPUs or fewer, else h2corn's 2); fewer cost "
           "less CPU per small request, more move large ones faster; needs --grpc-server or --http-server h2corn",
           {"type": int, "metavar": "N"}),
    Option("engine_cpus", ("--engine-cpus",),
           "run the engine process on these CPUs (the kernel's list syntax, e.g. 0-1) and the front-end "
           "processes on the others, as Triton's --host-policy cpu-cores (default: the kernel places them); "
           "see docs/serving-frontends.md", {"type": _cpu_list, "metavar": "LIST"}, text=format_cpu_list),
    Option("frontend_arena_bytes", ("--frontend-arena-mb",),
           "shared memory per front-end process for tensors in flight (default 1024; pages are used "
           "only as tensors arrive)",
           {"type": float, "metavar": "MB"}, value=lambda mb: int(mb * 2**20)),
    Option("exit_timeout_s", ("--exit-timeout",), "shutdown waits this long for in-flight requests (default 30)",
           {"type": float, "metavar": "S"}),
    # sharing one GPU between models (streamrt.serve.execution.rate_limiter, streamrt.serve.execution.memory_budget)
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
