"""Plan container: round trip, atomic writes, and rejection of broken or foreign files."""

from __future__ import annotations

import dataclasses
import struct
from pathlib import Path

import pytest

from streamrt.errors import PlanFormatError, PlanMismatchError
from streamrt.plan import FORMAT_VERSION, PlanManifest, check_field, read_manifest, read_plan, write_plan
from streamrt.types import DType, ShapeProfile, ShapeRange, TensorSpec


def _manifest() -> PlanManifest:
    return PlanManifest(
        backend="onnxruntime",
        backend_version="1.0",
        runtime_versions={"onnxruntime": "1.0"},
        device={"kind": "cpu", "arch": "x86_64"},
        precision="fp32",
        inputs=(TensorSpec("x", DType.FLOAT32, (-1, 4)),),
        outputs=(TensorSpec("y", DType.FLOAT16, (-1, 2)),),
        profiles=(ShapeProfile({"x": ShapeRange((1, 4), (2, 4), (8, 4))}),),
        source_sha256="ab" * 32,
        source_name="m.onnx",
        build_settings={"config": {"precision": "fp32"}},
        build_command="streamrt build m.onnx -o m.plan",
        created_at="2026-11-30T00:00:00+00:00",
        streamrt_version="0.1.0",
    )


def test_round_trip(tmp_path: Path) -> None:
    payload = bytes(range(256)) * 100
    path = write_plan(tmp_path / "m.plan", _manifest(), payload)
    plan = read_plan(path)
    assert plan.manifest == _manifest()
    assert plan.payload == payload
    assert read_manifest(path) == _manifest()


def test_atomic_write_keeps_old_plan_on_failure(tmp_path: Path) -> None:
    path = write_plan(tmp_path / "m.plan", _manifest(), b"old")

    class Exploding(bytes):
        def __len__(self) -> int:
            raise MemoryError("out of memory mid-write")

    with pytest.raises(MemoryError):
        write_plan(path, _manifest(), Exploding(b"new"))
    assert read_plan(path).payload == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.plan"]


def test_interrupted_write_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    def interrupted(fd: int) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "fsync", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write_plan(tmp_path / "m.plan", _manifest(), b"payload")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("cut", [1, 8, 20, 100, 33])
def test_truncated_plan_is_rejected(tmp_path: Path, cut: int) -> None:
    path = write_plan(tmp_path / "m.plan", _manifest(), b"x" * 1000)
    data = path.read_bytes()
    path.write_bytes(data[:-cut] if cut != 33 else data[:cut])
    with pytest.raises(PlanFormatError):
        read_plan(path)


def test_tampered_byte_fails_checksum(tmp_path: Path) -> None:
    path = write_plan(tmp_path / "m.plan", _manifest(), b"x" * 1000)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(PlanFormatError, match="checksum"):
        read_plan(path)


def test_foreign_file_is_rejected(tmp_path: Path) -> None:
    path = tmp_path / "model.onnx"
    path.write_bytes(b"\x08\x07\x12\x04abcd" * 10)
    with pytest.raises(PlanFormatError, match="not a StreamRT plan"):
        read_plan(path)


def test_unknown_format_version_is_rejected(tmp_path: Path) -> None:
    path = write_plan(tmp_path / "m.plan", _manifest(), b"p")
    data = bytearray(path.read_bytes())
    struct.pack_into("<I", data, 8, FORMAT_VERSION + 1)
    path.write_bytes(bytes(data))
    with pytest.raises(PlanFormatError, match="format version"):
        read_plan(path)


def test_incomplete_manifest_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(PlanFormatError, match="manifest"):
        PlanManifest.from_dict({k: v for k, v in _manifest().to_dict().items() if k != "device"})


def test_mismatch_names_field_values_and_rebuild_command() -> None:
    manifest = dataclasses.replace(_manifest(), backend_version="0.9")
    with pytest.raises(PlanMismatchError) as info:
        check_field(manifest, "onnxruntime version", manifest.backend_version, "1.0")
    text = str(info.value)
    assert "onnxruntime version='0.9'" in text and "'1.0'" in text
    assert "streamrt build m.onnx -o m.plan" in text


def test_plan_file_mode_follows_the_umask(tmp_path: Path) -> None:
    import os

    old = os.umask(0o022)
    try:
        path = write_plan(tmp_path / "m.plan", _manifest(), b"p")
    finally:
        os.umask(old)
    assert path.stat().st_mode & 0o777 == 0o644


def test_bad_magic_names_the_first_bytes(tmp_path: Path) -> None:
    path = tmp_path / "g.plan"
    path.write_bytes(b"garbage\n")
    with pytest.raises(PlanFormatError, match=r"not a StreamRT plan: it starts with b'garbage\\n'"):
        read_plan(path)


def test_unknown_format_version_hint_is_the_rebuild_command(tmp_path: Path) -> None:
    path = write_plan(tmp_path / "m.plan", _manifest(), b"p")
    data = bytearray(path.read_bytes())
    struct.pack_into("<I", data, 8, FORMAT_VERSION + 1)
    path.write_bytes(bytes(data))
    for reader in (read_plan, read_manifest):
        with pytest.raises(PlanFormatError) as info:
            reader(path)
        assert f"rebuild it: streamrt build m.onnx -o {path}" in str(info.value)


def test_rebuild_command_names_the_loaded_file_and_the_original() -> None:
    from streamrt.plan import rebuild_command

    recorded = "streamrt build /src/m.onnx -o /build/m.plan --backend onnxruntime"
    assert rebuild_command(recorded, "/build/m.plan") == recorded
    moved = rebuild_command(recorded, "/deploy/copy.plan")
    assert moved.startswith("streamrt build /src/m.onnx -o /deploy/copy.plan --backend onnxruntime")
    assert "built from /src/m.onnx as /build/m.plan" in moved
