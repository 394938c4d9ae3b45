"""The files stages hand each other: one module per producing stage owns their paths, what is checked
and the reader (with one error wording: :mod:`lenbatch_study.pipeline.artifacts.reading`). The table is in
DESIGN.md ("Artifacts"); a stage imports the modules of what it reads, never of what it writes."""
