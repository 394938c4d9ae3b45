"""Deprecated: the target model moved to :mod:`lenbatch.models.target`.

``import lenbatch.model`` still works and warns once; import ``lenbatch.models.target`` instead.
"""

import warnings

from lenbatch.models.target import *  # noqa: F401,F403
from lenbatch.models.target import __all__  # noqa: F401

warnings.warn("lenbatch.model is deprecated: import lenbatch.models.target instead (same names)",
              DeprecationWarning, stacklevel=2)
