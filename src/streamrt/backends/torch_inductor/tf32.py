"""The torch math switches a torch_inductor plan builds and runs under, set and restored around use.

TF32 tensor-core math for fp32 matmuls and cuDNN convolutions is on (``--tf32``) or off (IEEE
fp32, the default), and cuDNN benchmark mode is on at optimization level 5. These are
process-wide torch flags: :func:`backend_flags` sets them for a build or for one engine call and
puts the caller's values back afterwards, so loading or running a plan never changes the user's
process. They are always set explicitly: torch enables TF32 for cuDNN convolutions by default,
which put fp32 plans 2-3e-4 (relative L2) away from an fp32 reference on the H200.

The legacy ``allow_tf32`` flags are used on purpose: torch.export (2.11-2.13) reads them
internally and raises once the newer ``fp32_precision`` API has set conv and RNN flags, so the
two APIs cannot be mixed here. The flags are global, not per thread, so :func:`backend_flags`
is also a gate: calls that want the same flags run together, a call that wants other flags waits
until they are done, and callers enter in arrival order (by batches of equal flags), so none is
starved. A server running an IEEE
fp32 plan and a TF32 plan on two instance threads therefore never runs one under the other's
math. User code that runs eager torch in another thread at the same time is not covered.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from collections.abc import Iterator

import torch

__all__ = ["backend_flags", "set_tf32"]


Flags = tuple[bool, bool, bool]  # matmul TF32, cuDNN TF32, cuDNN benchmark


class _FlagsGate:
    """Who holds the process-wide flags now, with which values, and who waits for which.

    Phase-fair: the free gate goes to the oldest waiter, and with it every caller then waiting
    for the same flags; while somebody waits for other flags, newcomers wanting the held flags
    queue behind them. So equal flags run together and no caller is starved."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.held: Flags | None = None
        self.holders = 0
        self.saved: Flags = (False, False, False)
        self.tickets = itertools.count()
        self.waiting: dict[int, Flags] = {}  # ticket -> the flags its caller waits for
        self.admitted: set[int] = set()  # waiters let in with the current holders

    def may_enter(self, ticket: int, want: Flags, nested: int) -> bool:
        if nested:  # inside a block of this thread: only its own blocks may hold other flags
            return self.held == want or self.holders == nested
        others = [t for t, w in self.waiting.items() if w != want]
        if not self.holders:
            return not any(t < ticket for t in others)
        return self.held == want and (ticket in self.admitted or not others)

    def enter(self, want: Flags) -> None:
        if not self.holders:  # a new phase: everybody waiting for these flags comes along
            self.admitted = {t for t, w in self.waiting.items() if w == want}


_GATE = _FlagsGate()
_LOCAL = threading.local()  # how deep this thread is in backend_flags blocks


def _flags() -> Flags:
    matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    return bool(matmul.allow_tf32), bool(cudnn.allow_tf32), bool(cudnn.benchmark)


def _set(flags: Flags) -> None:
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark = flags


@contextlib.contextmanager
def backend_flags(tf32: bool, cudnn_benchmark: bool = False) -> Iterator[None]:
    """Run the block with TF32 on or off and cuDNN benchmark mode as given; restore them after.

    Blocks of different flags never overlap in the process (see the module docstring); a block
    inside another one of the same thread (a build that runs its plan) is re-entrant."""
    want: Flags = (tf32, tf32, cudnn_benchmark)
    gate = _GATE
    nested = getattr(_LOCAL, "depth", 0)
    with gate.cond:
        ticket = next(gate.tickets)
        if not gate.may_enter(ticket, want, nested):
            gate.waiting[ticket] = want
            try:
                gate.cond.wait_for(lambda: gate.may_enter(ticket, want, nested))
            finally:
                del gate.waiting[ticket]
        outer = gate.held
        gate.enter(want)
        if not gate.holders:
            gate.saved = _flags()
        if _flags() != want:
            _set(want)
        gate.held = want
        gate.holders += 1
        gate.cond.notify_all()  # waiters for the same flags may join now
    _LOCAL.depth = nested + 1
    try:
        yield
    finally:
        _LOCAL.depth = nested
        with gate.cond:
            gate.holders -= 1
            if not gate.holders:
                if _flags() != gate.saved:
                    _set(gate.saved)
                gate.held = None
                gate.admitted = set()
            elif outer is not None and outer != want:  # back to the enclosing block's flags
                _set(outer)
                gate.held = outer
            gate.cond.notify_all()


def set_tf32(enabled: bool) -> None:
    """TF32 on or off process-wide, without restoring: for callers that own the process (benchmark
    baselines running eager torch). StreamRT's builds and engines use :func:`backend_flags`."""
    torch.backends.cuda.matmul.allow_tf32 = enabled
    torch.backends.cudnn.allow_tf32 = enabled
