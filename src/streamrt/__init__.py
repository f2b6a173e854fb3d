"""StreamRT: build fast inference engines and keep the GPU busy while they run."""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
