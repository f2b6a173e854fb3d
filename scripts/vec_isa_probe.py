"""What Inductor's CPU vector-ISA probe costs a fresh process: ``import torch``, then ``valid_vec_isa_list()``.

AOTInductor's compile calls ``pick_vec_isa()`` for the wrapper's flags, even for a plan with no CPU kernel; the probe
builds a test program per ISA the CPU lists (kept in ``TORCHINDUCTOR_CACHE_DIR``) and loads each one, in torch 2.11
in a new Python process that imports torch. One line: the seconds of each and the ISAs found.
"""

from __future__ import annotations

import time


def main() -> None:
    started = time.perf_counter()
    import torch  # noqa: F401

    imported = time.perf_counter()
    from torch._inductor.cpu_vec_isa import pick_vec_isa, valid_vec_isa_list

    valid = valid_vec_isa_list()
    probed = time.perf_counter()
    print(f"import torch {imported - started:.1f} s; valid_vec_isa_list {probed - imported:.1f} s "
          f"({[str(isa) for isa in valid]}); picked {pick_vec_isa()}", flush=True)


if __name__ == "__main__":
    main()
