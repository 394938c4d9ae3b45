"""Torch data loading: the sampler, collate, the transformers Trainer integration."""
