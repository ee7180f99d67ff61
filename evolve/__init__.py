"""amemgym-evolve: self-evolving memory policies for LLM assistants, judged on-policy by an
AMemGym simulator.

Importing the package changes nothing in the caller's process (no environment variable, no
global setting). The `evolve` command and the `evolve.api` functions point DSPy's disk cache
at the toolkit's cache directory when they start (`evolve.core.paths.use_toolkit_caches`).
"""

__version__ = "0.1.0"
