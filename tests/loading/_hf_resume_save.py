"""Run under ``torchrun --nproc_per_node 2``: LengthBatchTrainer trains 4 steps and checkpoints at step 4
(mid epoch 0), for test_hf_resume's refusal of another world size.

usage: _hf_resume_save.py OUT
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from test_hf_resume import make_trainer  # noqa: E402

tr = make_trainer(Path(sys.argv[1]), max_steps=4)
tr.train()
# One file per rank: two ranks printing to one pipe can interleave their lines.
(Path(sys.argv[1]) / f"world-{tr.args.process_index}.txt").write_text(str(tr.args.world_size))
