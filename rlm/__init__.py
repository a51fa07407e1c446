"""The native RLM (Recursive Language Model) library: a model with one tool, ``python``,
investigates a corpus held as data in a persistent namespace.

It imports nothing of the hosted service and runs alone. See docs/RLM.md.
"""

from rlm.errors import RLMError
from rlm.settings import RLMSettings, load_settings

__all__ = ["RLMError", "RLMSettings", "load_settings"]
