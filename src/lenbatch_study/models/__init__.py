"""The frozen target, the drafter, the variable-length kernels, memory and packing checks."""
