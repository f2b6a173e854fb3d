"""``env_switch``: one spelling rule for every ``STREAMRT_*`` on/off variable; anything else refused."""

from __future__ import annotations

import pytest

from streamrt._env import env_switch
from streamrt.errors import ConfigError


@pytest.mark.parametrize(("value", "expected"), [("1", True), ("On", True), ("yes", True), ("TRUE", True),
                                                 ("0", False), ("off", False), (" No ", False), ("false", False),
                                                 ("", None), (None, None)])
def test_spellings_and_the_default(monkeypatch: pytest.MonkeyPatch, value: str | None, expected: bool | None) -> None:
    if value is None:
        monkeypatch.delenv("STREAMRT_X", raising=False)
    else:
        monkeypatch.setenv("STREAMRT_X", value)
    for default in (True, False):
        assert env_switch("STREAMRT_X", default) == (default if expected is None else expected)


def test_anything_else_is_refused_with_the_variable_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STREAMRT_FUSED_POSTPROCESS", "disabled")
    with pytest.raises(ConfigError, match="STREAMRT_FUSED_POSTPROCESS='disabled' is not an on/off value"):
        env_switch("STREAMRT_FUSED_POSTPROCESS", True)


def test_the_post_processing_switch_refuses_a_misspelling(monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    from streamrt.ops.postprocess import PostprocessConfig
    from streamrt.ops.postprocess_torch import TorchPostprocess

    monkeypatch.setenv("STREAMRT_FUSED_POSTPROCESS", "disabled")
    with pytest.raises(ConfigError, match="STREAMRT_FUSED_POSTPROCESS"):
        TorchPostprocess(PostprocessConfig(), "yolov8", 2, 8, device="cpu", dtype=torch.float32)
