"""Workflow plumbing: stage dependencies, staged outputs, the artifacts stages hand each other."""
