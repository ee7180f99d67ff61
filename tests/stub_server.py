"""Start `benchmarks/stub_openai_server.py` in its own process for fault and accounting tests.

with StubServer(latency=0.05) as stub:
    stub.base_url            # http://127.0.0.1:PORT/v1
    stub.set_fault("non_json", count=3)
    stub.stats()["chat_requests"]
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

STUB_SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "stub_openai_server.py"


class StubServer:
    def __init__(self, latency: float = 0.01, fault: str = "none") -> None:
        self.latency = latency
        self.fault = fault
        self.process: subprocess.Popen[str] | None = None
        self.base_url = ""

    def __enter__(self) -> StubServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, str(STUB_SCRIPT), "--port", "0", "--latency", str(self.latency)]
            + ["--fault", self.fault],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout is not None
        first_line = self.process.stdout.readline()
        match = re.search(r"(http://\S+/v1)", first_line)
        if not match:
            self.stop()
            raise RuntimeError(f"the stub server did not start: {first_line!r}")
        self.base_url = match.group(1)
        deadline = time.monotonic() + 20
        while True:
            try:
                self.stats()
                return
            except OSError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise
                time.sleep(0.05)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)

    def _request(self, path: str, payload: dict[str, Any] | None = None) -> dict[str, Any]:
        data = None if payload is None else json.dumps(payload).encode("utf-8")
        request = urllib.request.Request(
            f"{self.base_url}{path}", data=data, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=5) as response:
            return json.loads(response.read())

    def stats(self) -> dict[str, Any]:
        return self._request("/stats")

    def set_fault(self, mode: str, count: int | None = None) -> dict[str, Any]:
        return self._request("/fault", {"mode": mode, "count": count})
