"""amemgym-evolve: self-evolving memory policies for LLM assistants, judged on-policy by an
AMemGym simulator."""

from evolve.paths import prepare_process_environment

# Must run before anything imports dspy or litellm: it points DSPy's disk cache at the
# toolkit's cache directory and keeps litellm from fetching its cost map over the network.
prepare_process_environment()

__version__ = "0.1.0"
