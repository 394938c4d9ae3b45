"""docs/integrations.md: the sections exist, the install advice is there, and the over-long samples'
block runs as written and does what the prose says (the accelerate and Lightning blocks run under 2
processes in test_accelerate.py and test_lightning.py)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _integrations_doc import DOC, section_blocks  # noqa: E402


def test_sections_and_install_order():
    text = DOC.read_text()
    for title in (
        "Install",
        "accelerate",
        "Lightning",
        "transformers Trainer: what a resume must keep",
        "Samples longer than the token budget",
    ):
        assert f"\n## {title}\n" in text, title
    install = text[text.index("\n## Install\n") : text.index("\n## accelerate\n")]
    assert install.index("pip install torch") < install.index("pip install lenbatch")
    assert len(section_blocks("accelerate")) == 2 and len(section_blocks("Lightning")) == 2


def test_overflow_block_runs_and_trains_every_token(capsys):
    (block,) = section_blocks("Samples longer than the token budget")
    import lenbatch.loading.sampler as S

    trained = []
    real_iter = S.LengthBatchSampler.__iter__

    def recording_iter(self):
        for b in real_iter(self):
            trained.append((self.epoch, b))
            yield b

    S.LengthBatchSampler.__iter__ = recording_iter
    try:
        ns = {"__name__": "__doc__"}
        exec(block, ns)
    finally:
        S.LengthBatchSampler.__iter__ = real_iter
    assert "{'samples_over_budget': 2, 'tokens_dropped': 0, 'pieces_added': 3}" in capsys.readouterr().out
    lengths = ns["lengths"]
    for epoch in (0, 1):
        spans = []
        for e, batch in trained:
            if e == epoch:
                spans += [it if isinstance(it, tuple) else (it, 0, int(lengths[it])) for it in batch]
        assert sum(b - a for _, a, b in spans) == int(lengths.sum())  # every token once
        assert sorted({r for r, _, _ in spans}) == list(range(len(lengths)))
        assert max(b - a for _, a, b in spans) <= 1024
        assert sorted((a, b) for r, a, b in spans if r == 2) == [(0, 1024), (1024, 2048), (2048, 2500)]
    assert [b for e, b in trained if e == 0] != [b for e, b in trained if e == 1]
    # the last batch the loop received: one position 0 per piece (positions restart in every piece)
    assert int((ns["inputs"]["position_ids"] == 0).sum()) == len(trained[-1][1])
