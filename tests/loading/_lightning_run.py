"""Run as ``python _lightning_run.py BLOCKS_JSON OUT_PREFIX [CRASH_AFTER_STEPS]`` in the run directory:
the Lightning blocks of docs/integrations.md as written (Lightning starts the second process, re-running
this script). Records, per rank, the samples of every trained step (sample i's tokens are all i)."""

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
Model = ns["Model"]
step = Model.training_step
seen = []


def recording_step(self, batch, batch_idx):
    rows, starts = batch.seq_rows_starts()
    seen.append([self.current_epoch, batch.input_ids[rows, starts].tolist()])
    out = step(self, batch, batch_idx)
    if crash_after is not None and len(seen) == crash_after:
        raise Crash
    return out


Model.training_step = recording_step
try:
    exec(blocks[1], ns)
except Crash:
    pass
trainer = ns["trainer"]
loader = trainer.train_dataloader
sampler = loader.batch_sampler
flat = torch.cat([p.detach().flatten() for p in trainer.lightning_module.parameters()])
with open(f"{out_prefix}{trainer.global_rank}.json", "w") as f:
    json.dump(
        {
            "world": trainer.world_size,
            "sampler_world": sampler.world_size,
            "len_loader": len(loader),
            "len_plan": len(sampler.plan()),
            "min_batches": sampler.min_batches,
            "seen": seen,
            "weights": flat.tolist(),
        },
        f,
    )
