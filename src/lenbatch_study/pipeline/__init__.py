"""Workflow plumbing: the stage table (registry), its derived dependencies (deps), the readers of the files
stages hand each other (artifacts/), staged outputs and DVC plots."""
