"""NVDEC scaling (issue 27) on the CPU: ``scripts/gpu_nvdec_scaling.py --device cpu --quick`` runs every part
(OpenCV decoders standing in for NVDEC), and the NVDEC pool's own logic runs over a fake PyNvVideoCodec:
the context and stream each way hands to ``CreateDecoder``, decoders made per pass or kept, time stamps
in order, a kept decoder that decodes nothing falling back to new ones, a failed open ending the open test
with its error."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("cv2")

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_nvdec_scaling.py"


@pytest.mark.slow
def test_cpu_smoke_run_runs_every_part(tmp_path: Path) -> None:
    pytest.importorskip("av")  # the smoke clips are encoded with PyAV
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, str(SCRIPT), str(out), "--device", "cpu", "--quick",
                           "--clips", str(tmp_path / "none"),
                           "--variants", "legacy,primary+reuse,primary+reuse+p4,primary+reuse+ipc4"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    report = (out / "nvdec_scaling.md").read_text()
    assert "FAILED" not in report and "skipped" not in report
    for title in ("## Scaling: legacy", "## Scaling: primary+reuse", "## Open 3 sessions at once",
                  "## Scaling: primary+reuse+p4", "## Scaling: primary+reuse+ipc4", "## Summary"):
        assert title in report
    data = json.loads((out / "nvdec_scaling.json").read_text())
    assert not data["failed"]
    for rows in data["scaling"].values():
        assert [r["sessions"] for r in rows] == [1, 2] and all(r["in_order"] == r["sessions"] for r in rows)
    assert {k: v["opened"] for k, v in data["open"].items()} == {"legacy": 3, "primary+reuse": 3}


class _Frame:
    """A decoded picture: DLPack through a CPU tensor, and its time stamp."""

    def __init__(self, k: int) -> None:
        self.timestamp = k
        self._data = torch.full((6, 4), k % 256, dtype=torch.uint8)

    def __dlpack__(self, **kwargs: Any) -> Any:
        return self._data.__dlpack__(**kwargs)

    def __dlpack_device__(self) -> Any:
        return self._data.__dlpack_device__()


class FakeNvc:
    """PyNvVideoCodec's calls the pool makes: a demuxer of ``frames`` packets, decoders that record their kwargs."""

    def __init__(self, frames: int = 5, barren_after_flush: bool = False, fail_after: int | None = None) -> None:
        self.frames, self.barren_after_flush, self.fail_after = frames, barren_after_flush, fail_after
        self.created: list[dict[str, Any]] = []

    def CreateDemuxer(self, filename: str) -> Any:  # PyNvVideoCodec's names
        nvc = self

        class Demuxer:
            def __iter__(self) -> Any:
                return iter(range(nvc.frames))

            def GetNvCodecId(self) -> int:
                return 4

            def FrameRate(self) -> float:
                return 30.0

            def ChromaFormat(self) -> int:
                return 1

            def BitDepth(self) -> int:
                return 8

        return Demuxer()

    __version__ = "fake"

    def GetDecoderCaps(self, **kwargs: Any) -> dict[str, int]:
        return {"num_decoder_engines": 7}

    def CreateDecoder(self, **kwargs: Any) -> Any:
        if self.fail_after is not None and len(self.created) >= self.fail_after:
            raise RuntimeError("cuvidCreateDecoder(&hDecoder, &videoDecodeCreateInfo) returned error 2")
        self.created.append(kwargs)
        nvc = self

        class Decoder:
            flushed = False

            def Decode(self, packet: int) -> list[_Frame]:
                if self.flushed and nvc.barren_after_flush:
                    return []
                if packet == nvc.frames - 1:
                    self.flushed = True
                return [_Frame(packet)]

        return Decoder()


class _Stream:
    cuda_stream = 77

    def __init__(self, device: int = 0) -> None:
        pass

    def synchronize(self) -> None:
        pass


@pytest.fixture()
def fake(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> FakeNvc:
    from streamrt.video import decode_nvdec

    for name in ("x.mp4", "a.mp4", "b.mp4"):  # the pool checks that the files exist; the fake reads none
        (tmp_path / name).write_bytes(b"")
    monkeypatch.chdir(tmp_path)
    nvc = FakeNvc()
    monkeypatch.setattr(decode_nvdec, "_nvc", lambda: nvc)
    monkeypatch.setattr(decode_nvdec, "primary_context", lambda gpu: 1234)
    monkeypatch.setattr(torch.cuda, "Stream", _Stream)
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "default_stream", lambda gpu=None: _Stream())
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *a: (80 << 30, 140 << 30))
    return nvc


def _read(source: Any, n: int) -> list[Any]:
    out = []
    for _ in range(n):
        assert source.read() is not None
        out.append(source.last_pts)
    return out


@pytest.mark.parametrize(("context", "reuse", "handle", "decoders"), [("own", False, 0, 3), ("primary", True, 1234, 1)])
def test_each_way_hands_its_context_and_stream_and_makes_decoders_per_pass_or_once(
        fake: FakeNvc, context: str, reuse: bool, handle: int, decoders: int) -> None:
    from streamrt.video.decode_nvdec import NvdecOptions, NvdecPool

    options = NvdecOptions(context=context, reuse=reuse, timing=True)
    # depth=1: the worker decodes at most one picture ahead, so 12 read never begins a fourth pass (at the
    # default depth 4 it may, and the count of decoders made depends on the thread's timing)
    with NvdecPool(["x.mp4"], workers=1, depth=1, loop=True, options=options) as pool:
        (source,) = pool.sources()
        assert _read(source, 12) == [0, 1, 2, 3, 4] * 2 + [0, 1]  # three passes begun, in order
        stats = pool.stats()
    assert len(fake.created) == decoders == stats["opened"]
    assert {(k["cudacontext"], k["cudastream"]) for k in fake.created} == {(handle, 77)}


def test_a_kept_decoder_that_decodes_nothing_after_its_flush_falls_back_to_new_ones(fake: FakeNvc) -> None:
    from streamrt.video.decode_nvdec import NvdecOptions, NvdecPool

    fake.barren_after_flush = True
    with NvdecPool(["x.mp4"], workers=1, depth=1, loop=True,
                   options=NvdecOptions(context="primary", reuse=True)) as pool:  # depth=1: no fourth pass begun
        assert _read(pool.sources()[0], 11) == [0, 1, 2, 3, 4] * 2 + [0]
    assert len(fake.created) == 3  # the first, the barren pass's fallback, and one per pass after


def test_drain_and_the_open_test_on_the_nvdec_path(fake: FakeNvc) -> None:
    from streamrt.video.decode_nvdec import NvdecOptions
    from streamrt.video.decode_scaling import PoolSpec, drain, open_sessions

    spec = PoolSpec("nvdec", NvdecOptions(context="primary", reuse=True, timing=True))
    with spec.open(["a.mp4", "b.mp4"], sessions=3) as pool:
        r = drain(pool, 0.2, 0.05)
    assert r["sessions"] == 3 and r["fps"] > 0 and r["in_order"] == 3 and r["order_known"]
    assert set(r["host_ms_per_frame"]) == {"decode", "copy", "sync"} and r["gil"]["max_ms"] >= 0
    fake.fail_after = len(fake.created) + 4
    opened = open_sessions(spec, ["a.mp4"], 10, deadline=1e18, frames=3)
    assert opened["opened"] == 4 and opened["stopped"] == "failure" and "returned error 2" in opened["error"]
    assert opened["frames_read"] == 12 and opened["in_order"] == 4 and opened["mib_per_session_median"] == 0


def test_options_refuse_an_unknown_context() -> None:
    from streamrt.errors import ConfigError
    from streamrt.video.decode_nvdec import NvdecOptions

    with pytest.raises(ConfigError, match="own, primary"):
        NvdecOptions(context="shared")


def test_the_scripts_gpu_path_over_the_fake(fake: FakeNvc, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The script's CUDA branches (environment, decoder caps, memory per session, every in-process variant)."""
    import importlib.util

    from streamrt.video import decode_nvdec

    monkeypatch.setitem(sys.modules, "PyNvVideoCodec", fake)
    monkeypatch.setattr(decode_nvdec, "nvdec_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Fake H200")
    spec = importlib.util.spec_from_file_location("_nvdec_scaling", SCRIPT)
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "_nvdec_scaling", script)
    spec.loader.exec_module(script)
    variants = "legacy,primary+reuse,own+reuse,primary,primary+reuse+async,primary+reuse+w8"
    assert script.main([str(tmp_path / "out"), "--clips", str(tmp_path), "--quick", "--variants", variants]) == 0
    data = json.loads((tmp_path / "out" / "nvdec_scaling.json").read_text())
    assert data["environment"]["decoder engines"] == "7" and not data["failed"]
    assert set(data["scaling"]) == set(variants.split(",")) and all(len(r) == 2 for r in data["scaling"].values())
    assert all(r["opened"] == 3 and r["mib_per_session_median"] == 0 for r in data["open"].values())
    assert {k["cudacontext"] for k in fake.created} == {0, 1234}
    assert any(k.get("enableasyncallocations") for k in fake.created)


def test_a_decoder_process_loop_decodes_into_the_slots_it_is_handed(fake: FakeNvc,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """decode_processes' worker loop on the NVDEC path, run on a thread over the fake: open (first
    picture decoded, its shape answered), ring, a picture per slot handed back, in order, stop."""
    import queue
    import threading

    from streamrt.video.decode_nvdec import NvdecOptions
    from streamrt.video.decode_worker import _worker_main

    monkeypatch.setattr(torch.cuda, "set_device", lambda gpu: None)
    commands: queue.Queue[Any] = queue.Queue()
    events: queue.Queue[Any] = queue.Queue()
    worker = threading.Thread(target=_worker_main, args=(0, "nvdec", 0, NvdecOptions(), commands, events))
    worker.start()
    commands.put(("open", 3, "x.mp4", True, 1))
    assert events.get(timeout=5) == ("opened", 3, (6, 4), 30.0)
    ring = torch.full((2, 6, 4), 255, dtype=torch.uint8)  # poisoned: an unwritten slot reads 255
    commands.put(("ring", 3, ring))
    got = []
    for _ in range(7):
        op, stream, slot, pts = events.get(timeout=5)
        assert (op, stream) == ("frame", 3)
        got.append((pts, int(ring[slot].min()), int(ring[slot].max())))
        commands.put(("free", 3, slot))
    commands.put(("stop",))
    worker.join(timeout=5)
    assert not worker.is_alive()
    assert got == [(k, k, k) for k in (1, 2, 3, 4, 0, 1, 2)]  # the first frame skipped, a loop, in order
    assert len(fake.created) == 1 and fake.created[0]["cudacontext"] == 1234  # the default: primary, kept
