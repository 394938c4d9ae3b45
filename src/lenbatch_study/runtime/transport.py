"""Target -> drafter transport: batches and features over point-to-point, bounded by credits.

Two process groups carry a training run's traffic:

* the **data group** (the default group: NCCL on GPU, gloo on CPU) carries tensors only, and
  only from a target rank to the drafter rank: ``input_ids``, ``loss_mask``, ``lengths``,
  ``indices``, ``features`` of each batch, in the order of the global schedule;
* the **control group** (always gloo, CPU tensors) carries the small messages: the int64 header
  of each batch (target -> drafter: shapes, dtype, step, timings) and the credit of each batch
  (drafter -> target: ``[step, latest loss, stopping]``, sent as soon as the batch has arrived). After
  its last batch a target rank sends an end header (no tensors follow it).

Stopping early (a signal, :mod:`lenbatch_study.runtime.stopping`): a target rank's header carries the stop
signal it received (0 for none), so its drafter learns of it with the next batch; a drafter that stopped
credits every batch it still receives with ``stopping = 1`` and does not train it
(:meth:`DrafterLink.drain`). A target rank stops computing at the first such credit it retires, sends its
end header and drains its credits, so the drafter receives what was sent and nothing is left in flight:
at most ``queue_size`` forwards per target rank are wasted. No message is added per step.

Why it cannot deadlock under rendezvous semantics (NCCL: a send may block, on its
communicator's stream, until the peer has posted the matching receive; both directions of a
rank pair share that stream):

1. The data group never carries a drafter -> target message, so no send of the drafter's can
   sit ahead of its receives on a rank pair's stream (the old protocol sent the 16-byte ack on
   that stream, ahead of the next batch's receives, while the target posted the ack's receive
   only ``queue_size`` sends later: a cycle that only NCCL's eager delivery of small messages
   broke). Per rank pair the target's sends and the drafter's receives are the same sequence
   (the schedule's steps of that target rank, each ``HEADER`` then the five tensors).
2. The target posts the receive of batch ``k``'s credit *before* it sends batch ``k``'s header,
   so the drafter's credit send always finds its receive posted and never waits on the
   target's progress.
3. So the drafter waits only for the batch of the next scheduled step ``g`` (from target rank
   ``r``), and target rank ``r`` waits only (a) in a send of one of its batches ``k`` until the
   drafter posts that receive, or (b) for the credit of its batch ``k - queue_size``. Target
   rank ``r`` sends its batches in schedule order, so if the drafter waits for ``g`` then ``r``
   is at a batch ``k <= g`` (case a with ``k = g`` completes; ``k < g`` was received already)
   or ``k > g`` -- impossible while ``g`` is unsent. In case (b) ``k - queue_size < k <= g``:
   that batch was received and credited already. By induction over the global step, every
   step completes.

A stricter emulation runs the same code on CPU: with ``LENBATCH_RENDEZVOUS_P2P=1`` (test only)
every point-to-point send first waits, blocking its caller, for a one-byte "ready" that the
receiver sends on a dedicated gloo group when it posts the matching receive (one ready group
per group, so readies match sends in order as NCCL matches per communicator). Blocking the
calling thread is stricter than NCCL's stream-blocking (the caller can post nothing else
meanwhile), so a protocol that completes in this mode completes under NCCL's semantics.

Timing: on NCCL ``recv()``/``wait()`` return once the copy is enqueued,
not done (``wait()`` makes the current stream wait for NCCL's); :func:`settle` synchronizes the
current (compute) stream at the measured boundaries -- never the whole device, whose NCCL streams
hold sends that cannot finish before the peer posts its receive -- and is a
no-op on CPU, where gloo's calls return when the bytes are there. A target rank's staging of the
tensors onto the data group's device (the device-to-host copy when ranks share a GPU over gloo) is
timed by :meth:`TargetLink.send` and travels in the batch's header (``stage_s`` of the step).

The drafters of several nodes (:class:`DrafterGroup`, ``train.nodes > 1``) train one model
data-parallel on two groups of the drafter ranks only: after each backward a gloo all-reduce of the
small float64 vector ``[weight, has-gradient flag per parameter]`` (every drafter arrives here, so
the waiting for the slowest node lands in it: ``cluster_wait_s``), then one all-reduce of all
gradients flattened, each scaled by its drafter's loss weight ``w_k`` (on the data group's backend:
NCCL on GPUs; ``allreduce_s``), divided by ``W = sum_k w_k``. The drafter loss is
``sum(w ce) / sum(w)``, so ``sum_k w_k grad_k / W`` is exactly the gradient of the loss of all the
nodes' batches as one batch. A parameter no drafter has a gradient for keeps none (AdamW skips it,
as it would in one process). After the update every drafter all-gathers its row of the step and a
checksum of its weights (:func:`weights_checksum`) on the gloo group; a mismatch raises on every
drafter (:meth:`DrafterGroup.share`). Cost per step: one all-reduce of the drafter's parameter count
in fp32 (ring: ``2 (n-1)/n`` of it sent per drafter) plus two small gloo collectives.

Cost: per batch one 120-byte header and one 24-byte credit on gloo, five tensors on the data
group (``B*T*(8+1) + 2*S*8 + B*T*F*itemsize`` bytes; the features dominate: 2.5 GB per step at
49,152 tokens x 5 layers x 5,120 x 2 bytes).
"""

from __future__ import annotations

import datetime
import os
from collections import deque
from typing import Any, Optional

import torch

from lenbatch.loading.collate import Batch

RENDEZVOUS_ENV = "LENBATCH_RENDEZVOUS_P2P"
HEADER_LEN = 7 + 8  # layout, B, T, S, F, dtype code, stop signal + the caller's meta (7 ints) + staging nanoseconds
END = 2  # the header's layout code of a target rank's end of stream (0 padded, 1 packed)
DTYPE_CODES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}
CODE_DTYPES = {v: k for k, v in DTYPE_CODES.items()}


def rendezvous_requested() -> bool:
    """``LENBATCH_RENDEZVOUS_P2P=1`` (test only): emulate NCCL's blocking sends on gloo."""
    value = os.environ.get(RENDEZVOUS_ENV, "0")
    if value not in ("0", "1", ""):
        raise ValueError(f"{RENDEZVOUS_ENV} must be 0 or 1, got {value!r}")
    return value == "1"


def settle(device: torch.device) -> None:
    """Wait until this process's compute stream finished the work queued so far (received copies
    included, after their works' ``wait()``): a measured boundary. CUDA: the current stream's
    ``synchronize`` (not the device's: see the module doc); CPU: nothing to wait for."""
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()


class Channel:
    """Point-to-point sends and receives on the data group or the control group.

    ``Channel(rendezvous=None, timeout=None)`` must be built by every rank in the same order (it
    creates process groups: one gloo control group, plus two gloo ready groups in rendezvous mode;
    ``timeout``: theirs, torch's default when None).
    ``isend(t, dst, group="data"|"control")`` and ``irecv(t, src, group=...)`` return works.
    """

    def __init__(self, *, rendezvous: Optional[bool] = None, timeout: Optional[datetime.timedelta] = None) -> None:
        import torch.distributed as dist

        self.rendezvous = rendezvous_requested() if rendezvous is None else rendezvous
        control = dist.new_group(backend="gloo", timeout=timeout)
        self.groups = {"data": None, "control": control}  # None: the default group
        self.ready = (
            {name: dist.new_group(backend="gloo", timeout=timeout) for name in self.groups} if self.rendezvous else {}
        )
        self._readies: list[tuple[Any, torch.Tensor]] = []  # ready messages in flight (kept alive)

    def isend(self, tensor: torch.Tensor, dst: int, *, group: str) -> Any:
        import torch.distributed as dist

        if self.rendezvous:  # block until the peer has posted the matching receive
            token = torch.zeros(1, dtype=torch.uint8)
            dist.recv(token, dst, group=self.ready[group])
        return dist.isend(tensor, dst, group=self.groups[group])

    def irecv(self, tensor: torch.Tensor, src: int, *, group: str) -> Any:
        import torch.distributed as dist

        if self.rendezvous:  # tell the sender this receive is posted
            token = torch.ones(1, dtype=torch.uint8)
            self._readies.append((dist.isend(token, src, group=self.ready[group]), token))
            self._readies = [(w, t) for w, t in self._readies if not w.is_completed()]
        return dist.irecv(tensor, src, group=self.groups[group])

    def close(self) -> None:
        """Wait for the ready messages still in flight (rendezvous mode)."""
        for w, _ in self._readies:
            w.wait()
        self._readies = []


class TargetLink:
    """A target rank's end: sends batches to the drafter rank, at most ``queue_size`` unacknowledged.

    ``wait_for_room() -> seconds`` blocks until a batch may be sent (the credit of the batch sent
    ``queue_size`` batches ago); ``send(batch, features, meta)`` posts it (non-blocking unless in
    rendezvous mode); ``end()`` sends the end of stream; ``drain()`` waits for every credit. ``last_loss``: the
    drafter's latest loss as of the last credit (nan before one). ``stopped``: a credit said the drafter
    stopped (send nothing more: ``end()`` then ``drain()``). ``in_flight``: batches sent and not credited.
    """

    def __init__(self, channel: Channel, *, dst: int, queue_size: int, comm_device: torch.device) -> None:
        if queue_size < 1:
            raise ValueError(f"train.queue_size must be >= 1, got {queue_size}")
        self.channel, self.dst, self.queue_size, self.comm_device = channel, dst, queue_size, comm_device
        self.pending: deque[tuple[Any, torch.Tensor, list[Any], list[torch.Tensor]]] = deque()
        self.last_loss = float("nan")
        self.stopped = False
        self.pending_end: Optional[tuple[Any, torch.Tensor]] = None  # the end header's send (kept alive)
        self.last_bytes = 0  # bytes of the last batch sent on the data group
        self.last_stage_s = 0.0  # seconds the last batch's tensors took onto the data group's device

    @property
    def in_flight(self) -> int:
        return len(self.pending)

    def _retire_oldest(self) -> None:
        credit_work, credit, works, _tensors = self.pending.popleft()
        credit_work.wait()
        for w in works:  # the drafter holds the batch, so these are done (or about to be)
            w.wait()
        self.last_loss = float(credit[1])
        self.stopped = self.stopped or bool(credit[2])

    def wait_for_room(self) -> float:
        import time

        t0 = time.perf_counter()
        while len(self.pending) >= self.queue_size:
            self._retire_oldest()
        return time.perf_counter() - t0

    def send(self, batch: Batch, features: torch.Tensor, *, meta: list[int], stop: int = 0) -> None:
        """Post ``batch`` and its ``features`` (``meta``: 7 ints for the header; the seconds spent staging
        the tensors onto the data group's device are appended, in nanoseconds; ``stop``: the stop signal this
        rank received, 0 for none)."""
        import time

        assert len(self.pending) < self.queue_size, "call wait_for_room() first: the queue is full"
        B, T = batch.input_ids.shape
        t0 = time.perf_counter()
        tensors = [batch.input_ids, batch.loss_mask.to(torch.uint8), batch.lengths, batch.indices, features]
        tensors = [t.to(self.comm_device).contiguous() for t in tensors]  # a GPU -> host copy under gloo
        stage_ns = int((time.perf_counter() - t0) * 1e9)
        self.last_bytes = sum(t.numel() * t.element_size() for t in tensors)
        self.last_stage_s = stage_ns / 1e9
        header = torch.tensor(
            [
                1 if batch.layout == "packed" else 0,
                B,
                T,
                batch.num_sequences,
                features.shape[-1],
                DTYPE_CODES[features.dtype],
                int(stop),
                *meta,
                stage_ns,
            ],
            dtype=torch.int64,
        )
        assert header.numel() == HEADER_LEN, f"meta must hold {HEADER_LEN - 7} ints"
        credit = torch.zeros(3, dtype=torch.float64)
        # posted before the header: the drafter's credit send never waits for this rank (docstring, 2.)
        credit_work = self.channel.irecv(credit, self.dst, group="control")
        works = [self.channel.isend(header, self.dst, group="control")]
        works += [self.channel.isend(t, self.dst, group="data") for t in tensors]
        self.pending.append((credit_work, credit, works, [header, *tensors]))

    def end(self) -> None:
        """Tell the drafter this rank sends no more batches (a header of kind :data:`END`; no credit)."""
        header = torch.zeros(HEADER_LEN, dtype=torch.int64)
        header[0] = END
        self.pending_end = self.channel.isend(header, self.dst, group="control"), header

    def drain(self) -> None:
        while self.pending:
            self._retire_oldest()
        if self.pending_end is not None:
            self.pending_end[0].wait()
            self.pending_end = None


class DrafterLink:
    """The drafter rank's end: ``recv(src) -> (batch, features, meta)`` receives the next batch of
    target rank ``src`` (settled on the device: the transfer is inside the caller's timer), then
    credits it at once; None when ``src`` sent its end of stream instead. ``recv(..., device=)`` also moves
    the features there (a GPU run over gloo: from the host). ``last_stop``: the stop signal
    the last batch's sender had received (0 for none). ``stopping``: set it when this drafter stopped,
    then :meth:`drain` each target rank.

    ``last_transfer_s``: the seconds of the last batch's transport, from its header's arrival (its sender
    has posted every tensor by then) until its tensors are settled on ``device`` -- the wire plus the copy
    onto the drafter's device, without the wait for the target's forward; ``last_bytes``: its bytes on the
    data group (:func:`lenbatch_study.analysis.shapes.transport_bytes`)."""

    def __init__(self, channel: Channel, *, comm_device: torch.device) -> None:
        self.channel, self.comm_device = channel, comm_device
        self._credits: list[tuple[Any, torch.Tensor]] = []
        self.last_stop = 0
        self.stopping = False
        self.last_transfer_s = 0.0
        self.last_bytes = 0

    def recv(
        self, src: int, *, step: int, last_loss: float, device: Optional[torch.device] = None
    ) -> Optional[tuple[Batch, torch.Tensor, list[int]]]:
        import time

        header = torch.empty(HEADER_LEN, dtype=torch.int64)
        self.channel.irecv(header, src, group="control").wait()
        t0 = time.perf_counter()
        layout, B, T, S, Fdim, code, stop, *meta = (int(x) for x in header.tolist())
        if layout == END:
            return None
        self.last_stop = stop
        dev = self.comm_device
        ids = torch.empty(B, T, dtype=torch.int64, device=dev)
        lm = torch.empty(B, T, dtype=torch.uint8, device=dev)
        lengths = torch.empty(S, dtype=torch.int64, device=dev)
        indices = torch.empty(S, dtype=torch.int64, device=dev)
        feats = torch.empty(B, T, Fdim, dtype=CODE_DTYPES[code], device=dev)
        works = [self.channel.irecv(t, src, group="data") for t in (ids, lm, lengths, indices, feats)]
        for w in works:
            w.wait()
        settle(dev)  # NCCL: wait() only enqueued the copy; time it here, not in the next step
        self.last_bytes = sum(t.numel() * t.element_size() for t in (ids, lm, lengths, indices, feats))
        if device is not None and feats.device != torch.device(device):  # gloo on a GPU run: through the host
            feats = feats.to(device)
            settle(torch.device(device))
        self.last_transfer_s = time.perf_counter() - t0
        credit = torch.tensor([float(step), last_loss, float(self.stopping)], dtype=torch.float64)
        # the target posted this receive before sending the batch: completes without waiting on it
        self._credits.append((self.channel.isend(credit, src, group="control"), credit))
        self._credits = [(w, t) for w, t in self._credits if not w.is_completed()]
        return batch_from_parts("packed" if layout else "padded", ids, lm, lengths, indices), feats, meta

    def drain(self, src: int) -> int:
        """Receive ``src``'s batches up to its end of stream, untrained (credited as ``stopping`` says);
        returns how many there were (0 when the run ended at its last planned step)."""
        n = 0
        while self.recv(src, step=-1, last_loss=float("nan")) is not None:
            n += 1
        return n

    def close(self) -> None:
        for w, _ in self._credits:
            w.wait()
        self._credits = []


def weights_checksum(module: torch.nn.Module) -> int:
    """The sum of every parameter's bit patterns, as integers (fp32 -> int32, 16-bit -> int16): any one
    changed weight changes it, and equal weights give equal sums on any device. One pass over the
    parameters on their device; O(parameters)."""
    total = None
    for p in module.parameters():
        bits = {4: torch.int32, 2: torch.int16, 1: torch.int8, 8: torch.int64}[p.element_size()]
        part = p.detach().contiguous().view(bits).sum(dtype=torch.int64)
        total = part if total is None else total + part
    return int(total) if total is not None else 0


class DrafterGroup:
    """The drafter ranks of a multi-node run (module doc): ``DrafterGroup(ranks, rank=, comm_device=)`` must be
    built by every rank in the same order (it creates two process groups of ``ranks``).

    ``reduce(weight)`` replaces the drafter's gradients by the cluster's (set ``module`` first);
    ``share(row, checksum, extra)`` all-gathers each drafter's step row (None for a drafter without a batch)
    and weight checksum, raising ``RuntimeError`` when the checksums differ; ``broadcast(obj)`` sends
    node 0's object to every drafter. ``last_wait_s`` / ``last_allreduce_s``: the seconds of the last
    reduce's two collectives.
    """

    def __init__(self, ranks: list[int], *, rank: int, comm_device: torch.device) -> None:
        import torch.distributed as dist

        self.ranks, self.comm_device = list(ranks), comm_device
        self.data = dist.new_group(ranks=self.ranks)  # the default backend: NCCL on GPUs
        self.control = dist.new_group(ranks=self.ranks, backend="gloo")
        self.member = rank in self.ranks
        self.module: Optional[torch.nn.Module] = None
        self.last_wait_s = self.last_allreduce_s = 0.0

    def reduce(self, weight: float) -> None:
        import time

        import torch.distributed as dist

        assert self.module is not None, "set DrafterGroup.module to the trained drafter first"
        params = [p for p in self.module.parameters() if p.requires_grad]
        t0 = time.perf_counter()
        meta = torch.tensor([float(weight)] + [1.0 if p.grad is not None else 0.0 for p in params], dtype=torch.float64)
        dist.all_reduce(meta, group=self.control)  # every drafter is here: the wait for the slowest node ends
        t1 = time.perf_counter()
        total = float(meta[0])
        grads = [(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1).float() for p in params]
        flat = (torch.cat(grads) * float(weight)).to(self.comm_device)
        dist.all_reduce(flat, group=self.data)
        flat = flat.to(params[0].device) / (total if total > 0 else 1.0)
        settle(params[0].device)
        self.last_wait_s, self.last_allreduce_s = t1 - t0, time.perf_counter() - t1
        offset = 0
        for p, has in zip(params, meta[1:].tolist()):
            n = p.numel()
            p.grad = flat[offset : offset + n].view_as(p).to(p.dtype).clone() if has > 0 else None
            offset += n

    def share(
        self, row: Optional[dict[str, Any]], checksum: int, extra: Any = None, *, step: int
    ) -> list[tuple[Optional[dict[str, Any]], int, Any]]:
        """Every drafter's ``(row, checksum, extra)`` of cluster step ``step``, in node order; raises
        ``RuntimeError`` on every drafter when the weight checksums differ (the drafters no longer train
        one model)."""
        import torch.distributed as dist

        got: list[Any] = [None] * len(self.ranks)
        dist.all_gather_object(got, (row, int(checksum), extra), group=self.control)
        sums = [g[1] for g in got]
        if len(set(sums)) > 1:
            raise RuntimeError(
                f"the drafter weights differ between the nodes after cluster step {step} "
                f"(checksums by node: {sums}): the data-parallel update diverged"
            )
        return got

    def broadcast(self, obj: Any) -> Any:
        """Node 0's drafter's ``obj``, on every drafter (pickled over the gloo group)."""
        import torch.distributed as dist

        box = [obj]
        dist.broadcast_object_list(box, src=self.ranks[0], group=self.control)
        return box[0]


def batch_from_parts(
    layout: str, input_ids: torch.Tensor, loss_mask: torch.Tensor, lengths: torch.Tensor, indices: torch.Tensor
) -> Batch:
    """Rebuild a :class:`Batch` from its essential tensors (what travels between ranks).

    ``attention_mask``/``position_ids`` (padded) or ``position_ids``/``cu_seqlens``/``seq_index``
    (packed) are derived from ``lengths`` on ``input_ids``' device. ``labels`` do not travel: the
    rebuilt batch scores ``input_ids`` under ``loss_mask`` (the runtime's batches have no labels).
    """
    dev = input_ids.device
    lengths = lengths.to(torch.int64)
    B, T = input_ids.shape
    loss_mask = loss_mask.to(torch.bool)
    if layout == "padded":
        pos = torch.arange(T, dtype=torch.int64, device=dev).expand(B, T).contiguous()
        attention = (pos < lengths[:, None]).to(torch.int64)
        return Batch("padded", input_ids, loss_mask, pos, lengths, indices, attention_mask=attention)
    if layout == "packed":
        cu = torch.zeros(lengths.numel() + 1, dtype=torch.int64, device=dev)
        cu[1:] = torch.cumsum(lengths, 0)
        seq_index = torch.repeat_interleave(torch.arange(lengths.numel(), device=dev), lengths)
        pos = torch.arange(T, dtype=torch.int64, device=dev) - cu[:-1][seq_index]
        return Batch(
            "packed",
            input_ids,
            loss_mask,
            pos[None],
            lengths,
            indices,
            cu_seqlens=cu.to(torch.int32),
            seq_index=seq_index[None],
        )
    raise ValueError(f"unknown batch layout {layout!r}; use 'padded' or 'packed'")
