"""Run under ``accelerate launch --multi_gpu --num_processes 2`` (ACCELERATE_USE_CPU=1): a loader prepared
with dispatch_batches=True must be refused by the sampler with a ValueError naming the setting."""

import os

import numpy as np
import torch
from accelerate import Accelerator
from accelerate.utils import DataLoaderConfiguration

import lenbatch as lb

accelerator = Accelerator(dataloader_config=DataLoaderConfiguration(dispatch_batches=True))
lengths = np.random.default_rng(0).integers(8, 200, size=200)
try:
    sampler = lb.LengthBatchSampler(
        lengths, strategy="packed", token_budget=1024, max_batch_size=16, accelerator=accelerator
    )
    loader = torch.utils.data.DataLoader(
        [{"input_ids": [1] * int(n)} for n in lengths],
        batch_sampler=sampler,
        collate_fn=lambda b: lb.collate_packed(b).model_inputs(),
    )
    loader = accelerator.prepare(loader)
    for batch in loader:
        pass
    os.write(1, f"TRAINED {accelerator.process_index}\n".encode())
except ValueError as err:
    # one write per line: the two processes share the pipe, and unbuffered prints interleave word by word
    os.write(1, f"REFUSED {accelerator.process_index} {err}\n".encode())
    raise  # the other process, waiting in a broadcast, then fails too
