"""Host-memory reuse for CPU training loops (public path): ``lenbatch.hostmem.reuse_freed_memory()``.

The code lives in :mod:`lenbatch.runtime.hostmem`; this module is its stable public name.
"""

from lenbatch.runtime.hostmem import *  # noqa: F401,F403
from lenbatch.runtime.hostmem import __all__  # noqa: F401
