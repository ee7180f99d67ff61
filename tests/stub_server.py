"""The stub server's launcher for tests: `benchmarks/stub_openai_server.py`'s `StubServer`.

with StubServer(latency=0.05) as stub:
    stub.base_url            # http://127.0.0.1:PORT/v1
    stub.set_fault("non_json", count=3)
    stub.stats()["chat_requests"]

Loaded by path: `benchmarks/` is not a package, and one launcher serves tests and benchmarks.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

STUB_SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "stub_openai_server.py"


def _load_stub_module():
    name = "stub_openai_server"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, STUB_SCRIPT)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # before exec: dataclasses and pickling look it up
        spec.loader.exec_module(module)
    return sys.modules[name]


stub_openai_server = _load_stub_module()
StubServer = stub_openai_server.StubServer
