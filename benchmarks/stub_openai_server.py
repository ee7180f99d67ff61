"""A tiny OpenAI-compatible chat server for benchmarks: fixed latency, valid JSON outputs.

POST /v1/chat/completions sleeps `--latency` seconds, then answers with a JSON object that
fills every requested output field with a minimal valid value. Field names and types come
from the request's `response_format` JSON schema, or, without one, from DSPy's prompt
("Your output fields are: 1. `name` (type) ..."). Standard library only; run it as a separate
process so that its work never competes with the measured client for the GIL:

    python benchmarks/stub_openai_server.py --port 8765 --latency 0.1
"""

from __future__ import annotations

import argparse
import itertools
import json
import re
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

_ids = itertools.count(1)


def value_for(schema: dict[str, Any], defs: dict[str, Any], name: str = "") -> Any:
    """A minimal value valid for a JSON schema (enough for DSPy's output models)."""
    if "$ref" in schema:
        return value_for(defs.get(schema["$ref"].split("/")[-1], {}), defs, name)
    for key in ("anyOf", "oneOf", "allOf"):
        if schema.get(key):
            options = [s for s in schema[key] if s.get("type") != "null"] or schema[key]
            return value_for(options[0], defs, name)
    if "enum" in schema:
        return schema["enum"][0]
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "string")
    if kind == "object":
        properties = schema.get("properties", {})
        return {key: value_for(sub, defs, key) for key, sub in properties.items()}
    if kind == "array":
        return []
    if kind == "integer":
        return 1
    if kind == "number":
        return 1.0
    if kind == "boolean":
        return False
    return f"stub {name}".strip()


def outputs_for(request: dict[str, Any]) -> dict[str, Any]:
    response_format = request.get("response_format") or {}
    schema = None
    if isinstance(response_format, dict):
        schema = (response_format.get("json_schema") or {}).get("schema") or response_format.get(
            "schema"
        )
    if schema:
        return value_for(schema, schema.get("$defs", {}))
    system = "\n".join(
        str(m.get("content", "")) for m in request.get("messages", []) if m.get("role") == "system"
    )
    section = system.split("Your output fields are:", 1)[-1].split("All interactions", 1)[0]
    outputs: dict[str, Any] = {}
    for name, kind in re.findall(r"\d+\. `(\w+)` \(([^)]*)\)", section):
        kind = kind.lower()
        outputs[name] = 1 if "int" in kind else [] if kind.startswith("list") else f"stub {name}"
    return outputs


def make_handler(latency: float) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive: clients reuse connections
        # Headers and body go out in two writes; with Nagle on, the body waits for the
        # client's delayed ACK (~40 ms), which would be charged to the toolkit's overhead.
        disable_nagle_algorithm = True

        def _send(self, status: int, payload: dict[str, Any]) -> None:
            body = json.dumps(payload).encode("utf-8")
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:  # noqa: N802 (http.server naming)
            if self.path.rstrip("/").endswith("/models"):
                self._send(200, {"object": "list", "data": [{"id": "stub", "object": "model"}]})
            else:
                self._send(404, {"error": {"message": f"no route {self.path}"}})

        def do_POST(self) -> None:  # noqa: N802
            length = int(self.headers.get("Content-Length", "0"))
            request = json.loads(self.rfile.read(length) or b"{}")
            if not self.path.rstrip("/").endswith("/chat/completions"):
                self._send(404, {"error": {"message": f"no route {self.path}"}})
                return
            content = json.dumps(outputs_for(request))
            time.sleep(latency)
            prompt_chars = sum(len(str(m.get("content", ""))) for m in request.get("messages", []))
            prompt_tokens, completion_tokens = prompt_chars // 4, max(1, len(content) // 4)
            self._send(
                200,
                {
                    "id": f"stub-{next(_ids)}",
                    "object": "chat.completion",
                    "created": int(time.time()),
                    "model": request.get("model", "stub"),
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": content},
                            "finish_reason": "stop",
                        }
                    ],
                    "usage": {
                        "prompt_tokens": prompt_tokens,
                        "completion_tokens": completion_tokens,
                        "total_tokens": prompt_tokens + completion_tokens,
                    },
                },
            )

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            pass  # one line per request would dominate the benchmark's output

    return Handler


def serve(port: int, latency: float) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", port), make_handler(latency))
    server.daemon_threads = True
    print(f"stub server on http://127.0.0.1:{server.server_address[1]}/v1", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--latency", type=float, default=0.1, help="seconds slept per call")
    args = parser.parse_args()
    serve(args.port, args.latency)
