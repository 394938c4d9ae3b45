"""transformers integration (public path): ``from lenbatch.hf import LengthBatchTrainer`` (a ``Trainer``),
or ``LengthBatchMixin`` over any ``Trainer`` subclass: ``class MySFT(LengthBatchMixin, SFTTrainer)``.

The code lives in :mod:`lenbatch.loading.trainer`; this module is its stable public name.
Importing it imports transformers (``pip install 'lenbatch[model,hf]'``).
"""

from lenbatch.loading.trainer import *  # noqa: F401,F403
from lenbatch.loading.trainer import __all__  # noqa: F401
