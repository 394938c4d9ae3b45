"""The features' transport of a lockstep profile, measured between its two role processes: where each role
steps (:func:`role_devices`, as a training resolves its ranks), the data group's backend between them
(:func:`transport_backend`) and a free port to meet on (:func:`free_port`), and each grid point's batch and
features sent from the target role to the drafter role through the training's own links
(:func:`measure_transport`).

Separate from :mod:`lenbatch_study.stages.profile` (which times the steps pass by pass and writes
``grid.json``; it imports these names): the process group and the links are the runtime's
(:mod:`lenbatch_study.runtime.transport`), not the step timing. Cost: ``profile.repeats`` x grid points
sends plus one (see the profile stage's docstring).
"""

from __future__ import annotations

from lenbatch_study.core.config import Params

# A lockstep profile worker waits this long for the other at each phase before giving up.
BARRIER_TIMEOUT_S = 1800.0


def role_devices(params: Params, device: str) -> dict[str, str]:
    """Where each role steps: the target on the first local device, the drafter on the last
    (``train.nproc - 1``), resolved as a training run resolves its ranks (so ``LENBATCH_SHARE_GPU=1``
    puts both on the one GPU of a one-GPU check)."""
    from lenbatch_study.runtime.runner import resolve_device

    return {
        "target": str(resolve_device(device, 0)),
        "drafter": str(resolve_device(device, max(params.train.nproc - 1, 0))),
    }


def transport_backend(where: dict[str, str]) -> str:
    """The data group's backend between the two roles, as a training picks it
    (:func:`lenbatch_study.runtime.runner.init_process_group`): NCCL where each role has its own GPU, gloo
    (through the host) where they share one or run on CPU."""
    devs = [where["target"], where["drafter"]]
    return "nccl" if all(d.startswith("cuda") for d in devs) and devs[0] != devs[1] else "gloo"


def free_port() -> int:
    """A TCP port free on this host now (the two roles' process group meets there)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def measure_transport(
    role: str, params: Params, runner, batches: list[tuple], *, port: int, backend: str
) -> list[dict]:
    """Each grid point's batch and features sent ``profile.repeats`` times from the target role (rank 0) to
    the drafter role (rank 1) through :class:`~lenbatch_study.runtime.transport.TargetLink` and
    :class:`~lenbatch_study.runtime.transport.DrafterLink`, one batch in flight (so the drafter waits only
    for the transport), after one untimed send. Per point: the target's ``stage`` seconds, or the drafter's
    receive ``seconds`` and the ``bytes`` on the data group. Both roles call it at once."""
    import datetime

    import torch
    import torch.distributed as dist

    from lenbatch_study.runtime.transport import Channel, DrafterLink, TargetLink

    device = runner.device
    if backend == "nccl":
        torch.cuda.set_device(device)
    timeout = datetime.timedelta(seconds=BARRIER_TIMEOUT_S)
    dist.init_process_group(
        backend, init_method=f"tcp://127.0.0.1:{port}", rank=0 if role == "target" else 1, world_size=2, timeout=timeout
    )
    comm = device if backend == "nccl" else torch.device("cpu")
    out: list[dict] = []
    try:
        channel = Channel(timeout=timeout)
        fdim = len(params.model.target_layers) * params.model.hidden_size
        dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[params.model.dtype]
        reps = max(1, int(params.profile.repeats))
        if role == "target":
            link = TargetLink(channel, dst=1, queue_size=1, comm_device=comm)
            for i, (batch, _) in enumerate(batches):
                feats = torch.zeros(*batch.input_ids.shape, fdim, dtype=dtype, device=device)
                stage = []
                for k in range(reps + (i == 0)):
                    link.wait_for_room()
                    link.send(batch, feats, meta=[0, k, 0, 0, 0, 0, 0])
                    stage.append(link.last_stage_s)
                out.append({"stage": stage[-reps:]})
            link.end()
            link.drain()
        else:
            link = DrafterLink(channel, comm_device=comm)
            for i in range(len(batches)):
                secs, nbytes = [], 0
                for k in range(reps + (i == 0)):
                    got = link.recv(0, step=k, last_loss=float("nan"), device=device)
                    assert got is not None, "the target role ended its transport before the drafter's last point"
                    secs.append(link.last_transfer_s)
                    nbytes = link.last_bytes
                out.append({"seconds": secs[-reps:], "bytes": nbytes})
            assert link.recv(0, step=-1, last_loss=float("nan")) is None
            link.close()
        channel.close()
    finally:
        dist.destroy_process_group()
    return out
