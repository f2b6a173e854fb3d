"""Compiled ``.pt2`` packages kept in the ``--timing-cache`` directory: a rebuild of the same program copies one.

Why: AOTInductor does not use Inductor's FX graph cache (see :mod:`.cache`), so autotuning
timings alone leave every rebuild re-running Inductor's lowering and the C++ wrapper compile
(about 85 s for ResNet-50 fp16 on the H200, 2026-12-02). A package whose inputs are the same is
the same package, so a rebuild copies it instead.

The key (sha256) covers everything the package is made from:

- the exported program (:func:`program_digest`): its graph's text (operators, arguments), the graph
  signature, the range constraints of dynamic dims, every node's example value (shape, stride,
  dtype, device: static sizes are not in the graph's text), the example inputs' shapes (the opt
  shape kernels are tuned for) and the bytes of every parameter, buffer and constant. Why not
  ``torch.export.save``'s bytes: they are a zip of pickles, a full serialization per lookup, and
  not promised to be byte-stable; why not the source module's hash: two programs of one module
  differ in shapes and precision. Hashing ResNet-50's fp16 weights (50 MB) takes ~0.1 s.
- the Inductor configs of the compile (recipe, layout knobs, and the metadata, which names the
  inputs and the precision), the TF32 and cuDNN benchmark flags,
- the timing cache's identity (device, torch, Triton, CUDA versions).

Entries are ``DIR/streamrt-packages/<key>.pt2`` and ``<key>.json`` (the json written last, each
through a temporary file and a rename, so a reader sees a whole entry or none). The json says what
the package is: ``compiled`` (the compile of these configs finished: for an autotuning recipe, a
fully autotuned package) or ``fallback`` (the autotuned compile of these configs did not finish
within ``budget_s``; the package is the level-3 one the build kept) or ``fallback-tuned`` (the same, but the
package is the autotuned compile without coordinate descent that the child finished first: see
:mod:`.budget`). A fallback of either kind is reused only by a
build whose budget is not larger: one with more time tries autotuning again, and then finds the
level-3 package itself under the level-3 configs' key, so it skips that compile and gives the whole
budget to autotuning. An entry that cannot be read, whose package's sha256 or identity does not
match, is ignored with one warning per build; the cache never fails a build.

Beside the packages, ``structures/<key>.json`` records each program *structure* (:func:`structure_digest`: the
program without its weights' values) and configs that a build autotuned to the end, with its level-3 compile time:
a rebuild of that structure with new weights (a retrained model) misses the package but finds every autotuning
choice in the timing cache, so :mod:`.budget` autotunes it first instead of compiling the level-3 recipe first.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from streamrt.plan import atomic_write

__all__ = ["COMPILED", "FALLBACK", "PACKAGES_DIR", "TUNED_FALLBACK", "PackageCache", "program_digest",
           "structure_digest"]

log = logging.getLogger(__name__)

PACKAGES_DIR = "streamrt-packages"
COMPILED = "compiled"
FALLBACK = "fallback"
TUNED_FALLBACK = "fallback-tuned"
_KINDS = (COMPILED, FALLBACK, TUNED_FALLBACK)
STRUCTURES_DIR = "structures"
"""Under the packages: one record per program structure (weights aside) and configs autotuned to the end."""


def _value_text(value: Any) -> str:
    """A node's example value as text: shape, stride, dtype and device of tensors, recursively."""
    if isinstance(value, (list, tuple)):
        return "(" + ",".join(_value_text(v) for v in value) + ")"
    shape = getattr(value, "shape", None)
    if shape is not None and hasattr(value, "stride"):
        return f"T{tuple(str(s) for s in shape)}{tuple(str(s) for s in value.stride())}{value.dtype}{value.device}"
    return type(value).__name__ + ":" + str(value)


def _tensor_bytes(digest: Any, name: str, tensor: Any) -> None:
    import torch

    digest.update(name.encode())
    if not isinstance(tensor, torch.Tensor):
        digest.update(repr(tensor).encode())
        return
    flat = tensor.detach().cpu().contiguous().reshape(-1)
    digest.update(f"{flat.dtype}{tuple(tensor.shape)}".encode())
    digest.update(flat.view(torch.uint8).numpy().tobytes())


def program_digest(ep: Any) -> str:
    """sha256 of what an exported program compiles to: graph, shapes, example shapes and weights."""
    return _digest(ep, weights=True)


def structure_digest(ep: Any) -> str:
    """:func:`program_digest` without the weights' values (their names, shapes and dtypes only): what the
    program's kernels, and so their autotuning, depend on. The same model retrained has the same structure."""
    return _digest(ep, weights=False)


def _digest(ep: Any, weights: bool) -> str:
    import torch

    digest = hashlib.sha256()
    digest.update(str(ep.graph).encode())
    digest.update(str(ep.graph_signature).encode())
    digest.update(repr(sorted((str(k), str(v)) for k, v in ep.range_constraints.items())).encode())
    for node in ep.graph.nodes:
        digest.update(f"{node.name}={_value_text(node.meta.get('val'))};".encode())
    leaves = torch.utils._pytree.tree_leaves(ep.example_inputs)
    digest.update(_value_text(tuple(leaves)).encode())
    for prefix, tensors in (("w:", ep.state_dict), ("c:", ep.constants)):
        for name, tensor in sorted(tensors.items()):
            if weights:
                _tensor_bytes(digest, prefix + name, tensor)
            else:
                digest.update(f"{prefix}{name}={_value_text(tensor)};".encode())
    return digest.hexdigest()


@dataclass
class PackageCache:
    """Packages by key in ``folder/streamrt-packages`` (``folder`` is the build's ``--timing-cache``).

    Example:
        >>> cache = PackageCache(Path("timings"), {"device": "NVIDIA H200", "torch": "2.13.0"})  # doctest: +SKIP
        >>> cache.find(ep, configs, budget_s=300.0)            # None: compile, then      # doctest: +SKIP
        >>> cache.keep(ep, configs, package, COMPILED)                                     # doctest: +SKIP
    """

    folder: Path
    identity: Mapping[str, Any]
    flags: Mapping[str, Any] = field(default_factory=dict)
    warned: bool = False
    _programs: dict[int, tuple[Any, str]] = field(default_factory=dict, repr=False)

    @property
    def root(self) -> Path:
        return Path(self.folder) / PACKAGES_DIR

    def key(self, ep: Any, configs: Mapping[str, Any]) -> str:
        """The entry's name: the program's digest (computed once per program), configs, flags, identity."""
        known = self._programs.get(id(ep))
        if known is None or known[0] is not ep:
            known = (ep, program_digest(ep))
            self._programs[id(ep)] = known
        text = json.dumps({"program": known[1], "configs": dict(configs), "flags": dict(self.flags),
                           "identity": dict(self.identity)}, sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()

    def find(self, ep: Any, configs: Mapping[str, Any], budget_s: float | None) -> tuple[bytes, str] | None:
        """The package and its kind (:data:`COMPILED`, :data:`FALLBACK`, :data:`TUNED_FALLBACK`), or ``None`` when
        none may be reused."""
        key = self.key(ep, configs)
        meta_path = self.root / f"{key}.json"
        if not meta_path.is_file():
            return None
        try:
            entry = json.loads(meta_path.read_text())
            package = (self.root / f"{key}.pt2").read_bytes()
        except (OSError, ValueError) as exc:
            return self._ignore(key, f"unreadable ({type(exc).__name__}: {exc})")
        if not isinstance(entry, dict) or entry.get("key") != key or entry.get("kind") not in _KINDS:
            return self._ignore(key, "its record does not name this key")
        if entry.get("identity") != dict(self.identity):
            return self._ignore(key, f"made on {entry.get('identity')}, here {dict(self.identity)}")
        if hashlib.sha256(package).hexdigest() != entry.get("sha256"):
            return self._ignore(key, "the package's sha256 does not match its record (truncated or changed)")
        if entry["kind"] != COMPILED and not _fits(budget_s, entry.get("budget_s")):
            log.info("package cache: %s is the fallback of a %s s budget; this build's budget %s s is "
                     "larger, so it autotunes again", key[:16], entry.get("budget_s"), budget_s)
            return None
        return package, str(entry["kind"])

    def keep(self, ep: Any, configs: Mapping[str, Any], package: bytes, kind: str,
             budget_s: float | None = None) -> None:
        """Store ``package`` under the key of ``ep`` and ``configs``; a failure to write is a warning."""
        key = self.key(ep, configs)
        entry = {"key": key, "kind": kind, "budget_s": budget_s, "identity": dict(self.identity),
                 "sha256": hashlib.sha256(package).hexdigest(), "bytes": len(package)}
        try:
            with atomic_write(self.root / f"{key}.pt2") as f:
                f.write(package)
            with atomic_write(self.root / f"{key}.json") as f:
                f.write(json.dumps(entry, indent=2, sort_keys=True).encode())
        except OSError as exc:
            log.warning("package cache %s: could not store a package (%s: %s); the build goes on",
                        self.root, type(exc).__name__, exc)

    def _structure_path(self, ep: Any, configs: Mapping[str, Any]) -> Path:
        text = json.dumps({"structure": structure_digest(ep), "configs": dict(configs), "flags": dict(self.flags),
                           "identity": dict(self.identity)}, sort_keys=True, default=str)
        return self.root / STRUCTURES_DIR / f"{hashlib.sha256(text.encode()).hexdigest()}.json"

    def autotuned_before(self, ep: Any, configs: Mapping[str, Any]) -> float | None:
        """Seconds the level-3 compile took when an earlier build autotuned a program of ``ep``'s structure (other
        weights allowed) with ``configs`` to the end here; ``None`` if none did. Its autotuning choices are then
        in the timing cache."""
        path = self._structure_path(ep, configs)
        try:
            entry = json.loads(path.read_text()) if path.is_file() else None
        except (OSError, ValueError):
            return None
        if not isinstance(entry, dict) or entry.get("identity") != dict(self.identity):
            return None
        level3 = entry.get("level3_s")
        return float(level3) if isinstance(level3, (int, float)) and level3 >= 0 else None

    def note_autotuned(self, ep: Any, configs: Mapping[str, Any], level3_s: float) -> None:
        """Record that ``ep``'s structure was autotuned to the end with ``configs``, its level-3 compile taking
        ``level3_s`` (what :meth:`autotuned_before` returns); a failure to write is a warning."""
        entry = {"level3_s": round(float(level3_s), 2), "identity": dict(self.identity)}
        try:
            with atomic_write(self._structure_path(ep, configs)) as f:
                f.write(json.dumps(entry, indent=2, sort_keys=True).encode())
        except OSError as exc:
            log.warning("package cache %s: could not record an autotuned structure (%s: %s); the build goes on",
                        self.root, type(exc).__name__, exc)

    def _ignore(self, key: str, why: str) -> tuple[bytes, str] | None:
        if not self.warned:
            log.warning("package cache %s: ignoring entry %s: %s; compiling instead", self.root, key[:16], why)
            self.warned = True
        return None  # what find() returns for an entry it cannot reuse


def _fits(budget_s: float | None, fell_back_under: Any) -> bool:
    """A fallback made under ``fell_back_under`` seconds is reused by a build with no more time than that."""
    if budget_s is None or not isinstance(fell_back_under, (int, float)):
        return False  # no budget: the build autotunes to the end
    return budget_s <= float(fell_back_under)
