"""The files stages write and hand each other: one module per producing stage owns their names (and the
folder layout), what is checked and the reader (with one error wording:
:mod:`lenbatch_study.pipeline.artifacts.reading`); writers take the names or paths from it. The table is in
DESIGN.md ("Artifacts"); a stage imports the modules of what it reads and of what it writes."""
