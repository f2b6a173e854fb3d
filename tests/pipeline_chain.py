"""Stages that check every item sees only its own slot's data (shared by the pipeline tests)."""

from __future__ import annotations

from streamrt.device import Stream
from streamrt.pipeline import Slot, Stage, StageKind

__all__ = ["chain_stages"]


def chain_stages() -> list[Stage]:
    """Each stage reads what the previous one wrote into the slot and checks it belongs to
    this item: a slot reused too early, or a missing wait, shows up as a wrong value."""

    def load(slot: Slot, item: int, stream: Stream) -> None:
        slot["a"] = (item, slot.input)

    def square(slot: Slot, item: int, stream: Stream) -> None:
        owner, value = slot["a"]
        assert owner == item, f"item {item} read stage-1 data of item {owner}"
        slot["b"] = (item, value * value)

    def finish(slot: Slot, item: int, stream: Stream) -> None:
        owner, value = slot["b"]
        assert owner == item, f"item {item} read stage-2 data of item {owner}"
        slot.output = value + 1

    return [
        Stage("load", load, kind=StageKind.HOST),
        Stage("square", square, kind=StageKind.COMPUTE),
        Stage("finish", finish, kind="d2h"),
    ]
