"""The public surface of ``streamrt.ops`` and ``streamrt.video``: ``__all__`` names exist, and every public
class or function a module defines is listed in its ``__all__``."""

from __future__ import annotations

import importlib
import inspect

import pytest

MODULES = [
    "streamrt.ops",
    "streamrt.ops.layouts",
    "streamrt.ops.letterbox",
    "streamrt.ops.letterbox_torch",
    "streamrt.ops.nv12",
    "streamrt.ops.postprocess",
    "streamrt.ops.postprocess_torch",
    "streamrt.video",
    "streamrt.video.cameras",
    "streamrt.video.clips",
    "streamrt.video.decode_av",
    "streamrt.video.decode_nvdec",
    "streamrt.video.decode_processes",
    "streamrt.video.decoding",
    "streamrt.video.demo",
    "streamrt.video.hybrid",
    "streamrt.video.hybrid_policy",
    "streamrt.video.metrics",
    "streamrt.video.model",
    "streamrt.video.report",
    "streamrt.video.runner",
    "streamrt.video.sinks",
    "streamrt.video.sources",
    "streamrt.video.synthetic",
    "streamrt.video.workload",
]


@pytest.mark.parametrize("name", MODULES)
def test_all_names_exist_and_public_definitions_are_listed(name: str) -> None:
    module = importlib.import_module(name)
    for member in module.__all__:
        assert getattr(module, member, None) is not None, f"{name}.{member}"
    defined = {n for n, v in vars(module).items()
               if not n.startswith("_") and (inspect.isclass(v) or inspect.isfunction(v)) and v.__module__ == name}
    assert defined <= set(module.__all__), sorted(defined - set(module.__all__))


def test_host_ops_import_without_torch_or_opencv() -> None:
    import subprocess
    import sys

    code = ("import sys; sys.modules['torch'] = None; sys.modules['cv2'] = None\n"
            "from streamrt.ops import CpuLetterbox, CpuPostprocess, resolve_layout\n"
            "import numpy as np\n"
            "out = np.empty((3, 32, 32), np.float32)\n"
            "CpuLetterbox((24, 40), (32, 32))(np.zeros((24, 40, 3), np.uint8), out)\n"
            "print(CpuLetterbox((24, 40), (32, 32)).method)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "numpy"
