"""Run one target->drafter protocol under torchrun (gloo), for tests/runtime/test_transport.py.

    python -m torch.distributed.run --nproc_per_node 3 tests/runtime/_p2p_protocols.py {old,new} STEPS QUEUE

Ranks 0..N-2 are target ranks, N-1 the drafter; step g comes from target rank g mod (N-1).
``new``: lenbatch_study.runtime.transport (tensors on the data group, header and credits on gloo control).
``old``: the protocol train.py used before issue 15, rebuilt on the same Channel primitives: every
message on one group, the drafter's ack posted right after it received a batch, the target's ack
receive only when ``queue`` batches are in flight. The process group timeout is 15 s, so a hang
ends as a gloo timeout (exit 1) instead of blocking the test. Prints ``OK <checksum>`` on the drafter.
"""

from __future__ import annotations

import datetime
import sys
from collections import deque

import torch
import torch.distributed as dist

from lenbatch_study.runtime.transport import batch_from_parts
from lenbatch_study.runtime.transport import Channel, DrafterLink, TargetLink

TIMEOUT = datetime.timedelta(seconds=15)


def fake_batch(step: int):
    ids = torch.arange(6, dtype=torch.int64).reshape(2, 3) + step
    lm = torch.ones(2, 3, dtype=torch.bool)
    batch = batch_from_parts("padded", ids, lm, torch.tensor([3, 2]), torch.tensor([2 * step, 2 * step + 1]))
    return batch, torch.full((2, 3, 4), float(step))


def run_new(rank: int, world: int, steps: int, queue: int) -> float:
    chan = Channel(timeout=TIMEOUT)
    drafter = world - 1
    total = 0.0
    if rank == drafter:
        link = DrafterLink(chan, comm_device=torch.device("cpu"))
        for g in range(steps):
            batch, feats, meta = link.recv(g % (world - 1), step=g, last_loss=float(g))
            assert meta[1] == g and int(batch.input_ids[0, 0]) == g, (meta, g)
            total += float(feats.sum())
        link.close()
    else:
        link = TargetLink(chan, dst=drafter, queue_size=queue, comm_device=torch.device("cpu"))
        for g in range(rank, steps, world - 1):
            link.wait_for_room()
            batch, feats = fake_batch(g)
            link.send(batch, feats, meta=[0, g, 0, 0, 0, 0, 0])
        link.drain()
    chan.close()
    return total


def run_old(rank: int, world: int, steps: int, queue: int) -> float:
    chan = Channel(timeout=TIMEOUT)
    drafter = world - 1
    total = 0.0
    if rank == drafter:
        acks = []
        for g in range(steps):
            src = g % (world - 1)
            feats = torch.empty(2, 3, 4)
            chan.irecv(feats, src, group="data").wait()
            ack = torch.tensor([float(g), 0.0], dtype=torch.float64)
            acks.append((chan.isend(ack, src, group="data"), ack))  # ahead of the next receives
            total += float(feats.sum())
        for w, _ in acks:
            w.wait()
    else:
        in_flight: deque = deque()
        ack = torch.zeros(2, dtype=torch.float64)
        for g in range(rank, steps, world - 1):
            if len(in_flight) >= queue:
                chan.irecv(ack, drafter, group="data").wait()
                in_flight.popleft()[0].wait()
            feats = fake_batch(g)[1]
            in_flight.append((chan.isend(feats, drafter, group="data"), feats))
        while in_flight:
            chan.irecv(ack, drafter, group="data").wait()
            in_flight.popleft()[0].wait()
    chan.close()
    return total


def main() -> int:
    mode, steps, queue = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    dist.init_process_group("gloo", timeout=TIMEOUT)
    rank, world = dist.get_rank(), dist.get_world_size()
    total = (run_new if mode == "new" else run_old)(rank, world, steps, queue)
    if rank == world - 1:
        print(f"OK {total}", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
