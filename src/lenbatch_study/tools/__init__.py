"""The commands beside the workflow's stages: ``plan`` (one strategy's epoch as JSON), ``study-replay``,
``verify-packing``, ``params``, ``plots``, ``dvc-yaml`` and ``readme``. Each module is named
after its command and exposes ``run(**kwargs)`` like a stage; no stage imports one."""
