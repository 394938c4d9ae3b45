"""Time one target step and one drafter step of the default model on two batch shapes.

For A/B comparisons of two source trees on the same machine at the same time (the machine's speed
drifts between sessions, so absolute step times from different days are not comparable):

    PYTHONPATH=/path/to/old/src .venv/bin/python benchmarks/bench_step.py old
    PYTHONPATH=src              .venv/bin/python benchmarks/bench_step.py new

Prints the median of the last 4 of 6 target steps and the last 3 of 4 drafter steps (seconds).
Used on 2026-11-30 to show that the redesign did not change step times: base acdcf5c and the new code
both took 1.175-1.198 s per padded 32 x 512 target step, run side by side twice.
Cost: about 30 s (model build, 20 steps).
"""

from __future__ import annotations

import statistics
import sys
import time

# Older source trees (for A/B runs against them): one package with subpackages, or flat modules.
try:
    from lenbatch_study.core.config import load_params
    from lenbatch_study.runtime.runner import StepRunner, configure_process
    from lenbatch_study.stages import profile
except ImportError:
    try:
        from lenbatch.core.config import load_params  # type: ignore[no-redef]
        from lenbatch.runtime.runner import StepRunner, configure_process  # type: ignore[no-redef]
        from lenbatch.stages import profile  # type: ignore[no-redef]
    except ImportError:
        from lenbatch import profile  # type: ignore[no-redef]
        from lenbatch.config import load_params  # type: ignore[no-redef]

        try:
            from lenbatch.runner import StepRunner, configure_process  # type: ignore[no-redef]
        except ImportError:
            from lenbatch.train import StepRunner, configure_process  # type: ignore[no-redef]


def main(label: str) -> None:
    params = load_params("params.yaml")
    configure_process(params)
    runner = StepRunner(params, device="cpu", role="both")
    out = []
    for layout, lens in (("padded", [512] * 32), ("padded", [128] * 4)):
        batch = profile.make_batch(layout, lens, params, seed=0)
        target = []
        for _ in range(6):
            t0 = time.perf_counter()
            feats, _ = runner.target_step(batch)
            target.append(time.perf_counter() - t0)
        drafter = [runner.drafter_step(batch, feats, step=i, epoch=0)[1] for i in range(4)]
        out.append(
            f"{layout} {len(lens)}x{lens[0]}: target {statistics.median(target[2:]):.3f} s, "
            f"drafter {statistics.median(drafter[1:]):.3f} s"
        )
    print(label, " | ".join(out), flush=True)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "")
