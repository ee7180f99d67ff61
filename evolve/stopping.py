"""The process-wide stop event, in a leaf module: the commands set it on SIGINT / SIGTERM
(`evolve.commands.interrupt`), the runner checks it before each unit and LLM call, and the
LM clients' transports before sending each HTTP request (`evolve.llm.attempts`).

A leaf so that the command layer can own the signal handling without importing the LM
clients at start-up, and the LM layer can obey it without importing the command layer.
"""

from __future__ import annotations

import threading

STOP = threading.Event()
