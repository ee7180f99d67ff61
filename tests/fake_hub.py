"""A local HTTP server with the Hugging Face Hub's file layout, for real `huggingface_hub` calls.

with FakeHub({("org/repo-GGUF", "model.gguf"): b"GGUF..."}) as hub:
    os.environ["HF_ENDPOINT"] = hub.url
    hub.requests   # [("HEAD", "/org/repo-GGUF/resolve/main/model.gguf"), ("GET", ...)]

`/{repo}/resolve/{revision}/{filename}` answers HEAD and GET with the headers the library
reads: X-Repo-Commit, ETag (an LFS file's sha256, as the Hub sends it), Content-Length.
`announce_sha256` replaces the ETag (the Hub describing a file other than the one served).
"""

from __future__ import annotations

import hashlib
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

COMMIT = "0123456789abcdef0123456789abcdef01234567"


class FakeHub:
    def __init__(self, files: dict[tuple[str, str], bytes], announce_sha256: str | None = None):
        self.files = files
        self.announce_sha256 = announce_sha256
        self.requests: list[tuple[str, str]] = []
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:
                pass

            def do_HEAD(self) -> None:
                self._serve(with_body=False)

            def do_GET(self) -> None:
                self._serve(with_body=True)

            def _serve(self, with_body: bool) -> None:
                hub.requests.append((self.command, self.path))
                parts = self.path.split("?")[0].strip("/").split("/")
                content = None
                if len(parts) >= 5 and parts[2] == "resolve":
                    content = hub.files.get(("/".join(parts[:2]), "/".join(parts[4:])))
                if content is None:
                    self.send_response(404)
                    self.send_header("X-Error-Code", "EntryNotFound")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                etag = hub.announce_sha256 or hashlib.sha256(content).hexdigest()
                self.send_response(200)
                self.send_header("Content-Type", "application/octet-stream")
                self.send_header("Content-Length", str(len(content)))
                self.send_header("ETag", f'"{etag}"')
                self.send_header("X-Repo-Commit", COMMIT)
                self.end_headers()
                if with_body:
                    self.wfile.write(content)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> FakeHub:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
