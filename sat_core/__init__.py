"""SAT Explorer core: Show, Attend and Tell (Xu et al., 2015) in PyTorch.

The library never imports Streamlit; the app in ``explorer/`` calls into it. Importing it changes nothing
in the process: the commands and the app tune the memory allocator themselves (``allocator.keep_freed_memory``).
"""

from sat_core.errors import SatError

__all__ = ["SatError"]
