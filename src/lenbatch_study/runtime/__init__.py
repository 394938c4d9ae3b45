"""The torchrun runtime: step runner, transport, checkpoints, step records, process lifetime."""
