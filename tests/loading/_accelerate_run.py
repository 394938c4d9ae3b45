"""Run under ``accelerate launch --multi_gpu --num_processes 2``: the accelerate blocks of
docs/integrations.md, as written, in the current directory. Records, per rank, the samples of every
trained step (sample i's tokens are all i) and the final weights' checksum.

usage: _accelerate_run.py BLOCKS_JSON OUT_PREFIX [CRASH_AFTER_STEPS]
"""

import json
import sys

import torch

blocks = json.loads(open(sys.argv[1]).read())
out_prefix = sys.argv[2]
crash_after = int(sys.argv[3]) if len(sys.argv) > 3 else None


class Crash(Exception):
    pass


ns = {"__name__": "__main__"}
exec(blocks[0], ns)
step = ns["train_step"]
sampler, accelerator = ns["sampler"], ns["accelerator"]
seen = []


def recording_step(batch):
    rows, starts = batch.seq_rows_starts()
    seen.append([sampler.epoch, batch.input_ids[rows, starts].tolist()])
    step(batch)
    if crash_after is not None and len(seen) == crash_after:
        raise Crash


ns["train_step"] = recording_step
try:
    exec(blocks[1], ns)
except Crash:
    pass
model = accelerator.unwrap_model(ns["model"])
flat = torch.cat([p.detach().flatten() for p in model.parameters()])
with open(f"{out_prefix}{accelerator.process_index}.json", "w") as f:
    json.dump(
        {
            "world": accelerator.num_processes,
            "rank": sampler.rank,
            "sampler_world": sampler.world_size,
            "len_loader": len(ns["loader"]),
            "len_plan": len(sampler.plan()),
            "seen": seen,
            "weights": flat.tolist(),
        },
        f,
    )
accelerator.end_training()
