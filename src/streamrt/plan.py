"""The plan file: one self-describing container per engine, shared by every backend.

Layout (all integers little-endian)::

    b"STRTPLAN"                 8 bytes magic
    format_version              u32
    manifest_length             u64
    manifest                    UTF-8 JSON (see PlanManifest)
    payload_length              u64
    payload                     backend bytes (optimized ONNX, .pt2 package, TensorRT engine)
    sha256                      32 bytes over everything above

Plans are written to a temporary file in the target directory, flushed, fsync'ed and renamed
over the final name, so a crashed or interrupted build never leaves a half-written plan under
that name. Reading checks size, magic, format version and checksum before anything is parsed;
a truncated or tampered file raises :class:`PlanFormatError` and is never half-loaded.

Example:
    >>> write_plan("model.plan", manifest, payload)          # doctest: +SKIP
    >>> plan = read_plan("model.plan")                       # doctest: +SKIP
    >>> plan.manifest.backend, len(plan.payload)             # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import shlex
import struct
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from streamrt.errors import PlanFormatError, PlanMismatchError
from streamrt.types import ShapeProfile, TensorSpec

__all__ = [
    "FORMAT_VERSION",
    "Plan",
    "PlanManifest",
    "atomic_write",
    "check_field",
    "is_plan_file",
    "new_file_mode",
    "read_manifest",
    "read_plan",
    "rebuild_command",
    "write_plan",
]

MAGIC = b"STRTPLAN"
FORMAT_VERSION = 1
_HEADER = struct.Struct("<8sIQ")  # magic, format version, manifest length
_U64 = struct.Struct("<Q")
_DIGEST = 32


@dataclass(frozen=True)
class PlanManifest:
    """Everything a plan says about itself. Stored as JSON at the head of the file.

    Attributes:
        backend: registry name of the backend that built the payload.
        backend_version: version of the library that runs the payload (onnxruntime, torch, tensorrt).
        runtime_versions: versions of every library the payload depends on.
        device: the build target, e.g. ``{"kind": "cuda", "name": "NVIDIA H200",
            "compute_capability": "9.0", "cuda": "13.0"}`` or ``{"kind": "cpu", "arch": "x86_64"}``.
        precision: ``fp32``, ``fp16``, ``bf16``, ``int8``...
        inputs / outputs: IO tensor specs, in engine order.
        profiles: shape profiles the engine accepts.
        source_sha256: SHA-256 of the source model bytes.
        source_name: file name of the source model, for messages.
        build_settings: the BuildConfig as a dict, plus backend-recorded settings.
        build_command: the ``streamrt build`` command that rebuilds this plan.
        created_at: ISO-8601 UTC time of the build.
        streamrt_version: version of StreamRT that wrote the plan.
        extra: backend-specific facts (e.g. compatibility flags).
        source_metadata: the source model's ONNX ``metadata_props`` (class names, input size...),
            so applications can read them from a plan without the ONNX file.
        precision_report: for fp16/bf16/int8 plans, what the precision transform kept in fp32
            and why, the accuracy against the fp32 reference, and (int8) the speed against fp32
            (:mod:`streamrt.building.accuracy_gate`).
    """

    backend: str
    backend_version: str
    runtime_versions: Mapping[str, str]
    device: Mapping[str, Any]
    precision: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    profiles: tuple[ShapeProfile, ...]
    source_sha256: str
    source_name: str
    build_settings: Mapping[str, Any]
    build_command: str
    created_at: str
    streamrt_version: str
    extra: Mapping[str, Any] = field(default_factory=dict)
    source_metadata: Mapping[str, str] = field(default_factory=dict)
    precision_report: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["inputs"] = [t.to_dict() for t in self.inputs]
        d["outputs"] = [t.to_dict() for t in self.outputs]
        d["profiles"] = [p.to_dict() for p in self.profiles]
        return d

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PlanManifest:
        try:
            return cls(
                backend=str(data["backend"]),
                backend_version=str(data["backend_version"]),
                runtime_versions=dict(data["runtime_versions"]),
                device=dict(data["device"]),
                precision=str(data["precision"]),
                inputs=tuple(TensorSpec.from_dict(t) for t in data["inputs"]),
                outputs=tuple(TensorSpec.from_dict(t) for t in data["outputs"]),
                profiles=tuple(ShapeProfile.from_dict(p) for p in data["profiles"]),
                source_sha256=str(data["source_sha256"]),
                source_name=str(data["source_name"]),
                build_settings=dict(data["build_settings"]),
                build_command=str(data["build_command"]),
                created_at=str(data["created_at"]),
                streamrt_version=str(data["streamrt_version"]),
                extra=dict(data.get("extra", {})),
                source_metadata={str(k): str(v) for k, v in dict(data.get("source_metadata", {})).items()},
                precision_report=dict(data.get("precision_report", {})),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise PlanFormatError(f"plan manifest is incomplete or malformed: {exc!r}") from exc


@dataclass(frozen=True)
class Plan:
    """A verified plan: manifest plus backend payload."""

    manifest: PlanManifest
    payload: bytes
    path: Path | None = None


@contextlib.contextmanager
def atomic_write(path: str | Path) -> Iterator[IO[bytes]]:
    """Open a temporary file next to ``path``; rename it over ``path`` only if the block succeeds.

    On any exception (including KeyboardInterrupt and MemoryError) the temporary file is
    removed and ``path`` is left as it was.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".partial", dir=target.parent)
    tmp = Path(tmp_name)
    try:
        # mkstemp creates 0600; the final file gets the mode any other new file would get.
        os.fchmod(fd, new_file_mode())
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def new_file_mode() -> int:
    """The mode ``open(path, "w")`` would give a new file: 0o666 less the process umask."""
    return 0o666 & ~_umask()


def _umask() -> int:
    """The process umask (read without changing it where /proc allows)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _encode(manifest: PlanManifest, payload: bytes) -> list[bytes]:
    meta = json.dumps(manifest.to_dict(), sort_keys=True).encode()
    return [_HEADER.pack(MAGIC, FORMAT_VERSION, len(meta)), meta, _U64.pack(len(payload)), payload]


def write_plan(path: str | Path, manifest: PlanManifest, payload: bytes) -> Path:
    """Write a plan atomically and return its path."""
    parts = _encode(manifest, payload)
    digest = hashlib.sha256()
    with atomic_write(path) as f:
        for part in parts:
            digest.update(part)
            f.write(part)
        f.write(digest.digest())
    return Path(path)


#: File names read as plans even when the magic is wrong, so that a damaged ``model.plan`` is
#: reported as a bad plan (with its first bytes), not as "not an ONNX model".
PLAN_SUFFIXES = (".plan", ".engine")


def is_plan_file(path: str | Path) -> bool:
    """True when the file starts with the plan magic, or is an existing file named ``*.plan``/``*.engine``.

    Cheap: reads 8 bytes. Callers then read it with :func:`read_plan`, which names what is wrong.
    """
    try:
        with open(path, "rb") as f:
            return f.read(len(MAGIC)) == MAGIC or Path(path).suffix.lower() in PLAN_SUFFIXES
    except OSError:
        return False


def _parse_header(data: bytes, name: str, rest: IO[bytes] | None = None) -> tuple[int, int]:
    if len(data) < _HEADER.size or data[: len(MAGIC)] != MAGIC:
        raise PlanFormatError(
            f"{name} is not a StreamRT plan: it starts with {data[: len(MAGIC)]!r}, a plan starts with {MAGIC!r}",
            hint="build one with 'streamrt build MODEL.onnx -o PLAN'",
        )
    _, version, meta_len = _HEADER.unpack_from(data)
    if version != FORMAT_VERSION:
        command = _recorded_command(data[_HEADER.size : _HEADER.size + meta_len] if rest is None
                                    else rest.read(meta_len))
        rebuild = f"rebuild it: {rebuild_command(command, name)}" if command else (
            "rebuild it from its model with 'streamrt build MODEL.onnx -o PLAN'")
        raise PlanFormatError(
            f"{name} has plan format version {version}, this StreamRT reads version {FORMAT_VERSION}",
            hint=rebuild,
        )
    return version, meta_len


def _recorded_command(meta: bytes) -> str | None:
    """The build command of a manifest this version cannot parse in full (best effort, for the hint)."""
    try:
        command = json.loads(meta).get("build_command")
    except (ValueError, AttributeError):
        return None
    return command if isinstance(command, str) and command else None


def rebuild_command(recorded: str, plan_path: str | Path | None) -> str:
    """The recorded build command, writing to ``plan_path`` (the file being loaded).

    A plan copied or renamed after its build still records the original ``-o`` path; the command
    then writes the loaded file and says where the plan was first built.
    """
    if plan_path is None:
        return recorded
    try:
        args = shlex.split(recorded)
    except ValueError:
        return recorded
    if "-o" not in args or args.index("-o") + 1 >= len(args):
        return recorded
    at = args.index("-o") + 1
    original, loaded = args[at], str(plan_path)
    if Path(original).resolve() == Path(loaded).resolve():
        return recorded
    args[at] = loaded
    source = args[2] if len(args) > 2 else "?"
    return f"{shlex.join(args)} ({loaded} was built from {source} as {original})"


def read_plan(path: str | Path) -> Plan:
    """Read and verify a plan file (checksum first, then structure)."""
    p = Path(path)
    if not p.is_file():
        raise PlanFormatError(f"plan file not found: {p}")
    data = p.read_bytes()
    _, meta_len = _parse_header(data, str(p))
    if len(data) < _HEADER.size + _DIGEST:
        raise PlanFormatError(f"{p} is truncated ({len(data)} bytes)", hint="rebuild the plan")
    body, digest = data[:-_DIGEST], data[-_DIGEST:]
    if hashlib.sha256(body).digest() != digest:
        raise PlanFormatError(
            f"{p} failed its checksum: the file is truncated or was modified after it was written",
            hint="rebuild the plan",
        )
    meta_end = _HEADER.size + meta_len
    if meta_end + _U64.size > len(body):
        raise PlanFormatError(f"{p} is truncated inside the manifest")
    (payload_len,) = _U64.unpack_from(body, meta_end)
    payload_start = meta_end + _U64.size
    if payload_start + payload_len != len(body):
        raise PlanFormatError(f"{p} payload length {payload_len} does not match the file size")
    try:
        meta = json.loads(body[_HEADER.size : meta_end])
    except ValueError as exc:
        raise PlanFormatError(f"{p} has an unreadable manifest: {exc}") from exc
    manifest = PlanManifest.from_dict(meta)
    return Plan(manifest=manifest, payload=body[payload_start:], path=p)


def read_manifest(path: str | Path) -> PlanManifest:
    """Read only the manifest (no checksum over the payload): for ``inspect`` and cache look-ups."""
    p = Path(path)
    with open(p, "rb") as f:
        head = f.read(_HEADER.size)
        _, meta_len = _parse_header(head, str(p), f)
        meta = f.read(meta_len)
    if len(meta) != meta_len:
        raise PlanFormatError(f"{p} is truncated inside the manifest")
    try:
        return PlanManifest.from_dict(json.loads(meta))
    except ValueError as exc:
        raise PlanFormatError(f"{p} has an unreadable manifest: {exc}") from exc


def check_field(manifest: PlanManifest, field_name: str, plan_value: Any, local_value: Any) -> None:
    """Raise :class:`PlanMismatchError` when a plan's recorded value differs from this machine's."""
    if plan_value != local_value:
        raise PlanMismatchError(field_name, plan_value, local_value, manifest.build_command)
