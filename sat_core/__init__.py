"""SAT Explorer core: Show, Attend and Tell (Xu et al., 2015) in PyTorch.

The library never imports Streamlit; the app in ``explorer/`` calls into it.
"""

import sat_core.allocator  # noqa: F401  (glibc keeps freed memory: see allocator.py)
from sat_core.errors import SatError

__all__ = ["SatError"]
