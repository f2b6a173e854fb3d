"""Write the generated C++ of torch_inductor plans: each profile's AOTInductor wrapper (and CPU kernel) source.

The wrapper lists every kernel launch and extern call in order, each under a comment naming the FX
nodes and ATen ops it came from (``Topologically Sorted Source Nodes: [...], Original ATen: [...]``),
which is what tells a kernel table's ``triton_poi_fused_convolution_3`` apart from the others. The
H200 profile step writes these beside the kernel tables (``scripts/h200_video_call.sh``).

Usage: python scripts/plan_sources.py PLAN [PLAN ...] --out DIR
"""

from __future__ import annotations

import argparse
import io
import sys
import zipfile
from pathlib import Path

from streamrt.errors import PlanFormatError
from streamrt.plan import read_plan

SUFFIXES = (".wrapper.cpp", ".kernel.cpp")


def write_sources(plan_path: Path, out: Path) -> list[Path]:
    """Each profile's generated sources of one plan into ``out`` (``<plan>-p<profile><suffix>``)."""
    plan = read_plan(plan_path)
    if plan.manifest.backend != "torch_inductor":
        raise PlanFormatError(f"{plan_path} is a {plan.manifest.backend} plan; only torch_inductor plans carry "
                              "generated sources")
    written = []
    out.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(io.BytesIO(plan.payload)) as payload:
        for name in sorted(n for n in payload.namelist() if n.endswith(".pt2")):
            profile = Path(name).stem.removeprefix("profile_")
            with zipfile.ZipFile(io.BytesIO(payload.read(name))) as package:
                for member in package.namelist():
                    suffix = next((s for s in SUFFIXES if member.endswith(s)), None)
                    if suffix:
                        target = out / f"{plan_path.stem}-p{profile}{suffix}"
                        target.write_bytes(package.read(member))
                        written.append(target)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("plans", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    failed = 0
    for plan in args.plans:
        try:
            for path in write_sources(plan, args.out):
                launches = path.read_text(errors="replace").count("Topologically Sorted Source Nodes")
                print(f"{path} ({path.stat().st_size} bytes, {launches} commented launches)")
        except (OSError, PlanFormatError) as exc:  # the other plans still get theirs
            print(f"{plan}: {exc}", file=sys.stderr)
            failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
