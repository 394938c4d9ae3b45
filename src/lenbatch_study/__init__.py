"""The lenbatch study: which way of batching trains a DFlash drafter fastest, predicted and measured.

The experiment around the library :mod:`lenbatch`: the chat corpus and its tokenizing (``corpus``), the
Qwen3.5 target and the drafter with their kernels (``models``), the torchrun pipeline that trains them
(``runtime``), the step-time model, gradient quality and the reports (``analysis``), the workflow's stages
and their plumbing (``stages``, ``pipeline``) and the ``lenbatch`` command (``cli``). It imports the
library; the library never imports it.
"""
