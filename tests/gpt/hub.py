"""A stand-in for the Hugging Face Hub on 127.0.0.1: the tree listing of a dataset (paged, with
each file's Git LFS object id, its SHA-256) and its files, answering Range requests."""

from __future__ import annotations

import hashlib
import http.server
import json
import re
import threading


class Hub:
    """Serves ``files`` (name -> bytes) as the dataset ``repo``; ``log`` holds (path, Range) per request."""

    def __init__(self, repo: str, files: dict[str, bytes], page: int = 50):
        self.repo, self.files, self.page = repo, files, page
        self.listed = {name: hashlib.sha256(data).hexdigest() for name, data in files.items()}
        self.log: list[tuple[str, str | None]] = []
        hub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                hub.log.append((self.path, self.headers.get("Range")))
                listing = f"/api/datasets/{hub.repo}/tree/main"
                if self.path.startswith(listing):
                    self._listing(int((re.search(r"cursor=(\d+)", self.path) or [0, 0])[1]))
                    return
                prefix = f"/datasets/{hub.repo}/resolve/main/"
                name = self.path[len(prefix):] if self.path.startswith(prefix) else ""
                if name not in hub.files:
                    self.send_error(404)
                    return
                body = hub.files[name]
                match = re.fullmatch(r"bytes=(\d+)-", self.headers.get("Range") or "")
                start = int(match.group(1)) if match else 0
                self.send_response(206 if match else 200)
                if match:
                    self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
                self.send_header("Content-Length", str(len(body) - start))
                self.end_headers()
                self.wfile.write(body[start:])

            def _listing(self, cursor: int) -> None:
                names = sorted(hub.files)
                entries = [{"type": "file", "path": n, "size": len(hub.files[n]),
                            "lfs": {"oid": hub.listed[n], "size": len(hub.files[n])}}
                           for n in names[cursor:cursor + hub.page]]
                if cursor == 0:
                    entries.insert(0, {"type": "file", "path": ".gitattributes", "size": 10})
                body = json.dumps(entries).encode()
                self.send_response(200)
                if cursor + hub.page < len(names):
                    base = f"http://127.0.0.1:{hub.port}/api/datasets/{hub.repo}/tree/main"
                    self.send_header("Link", f'<{base}?cursor={cursor + hub.page}>; rel="next"')
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def downloads(self) -> list[str]:
        return [path.rsplit("/", 1)[1] for path, _ in self.log if "/resolve/" in path]

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join()
