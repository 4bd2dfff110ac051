#!/usr/bin/env python3
"""A logging reverse proxy between Open WebUI and `kvmem serve` (standard library only).

    proxy.py LISTEN_PORT UPSTREAM_URL LOG.jsonl

Every request is passed on unchanged and written to LOG.jsonl, one JSON object a line:
time, method, path, request headers, request body (parsed when JSON), the answer's status
and headers, its time to first byte and total time, and its body (for a streamed answer,
the SSE events' JSON with the text of the content deltas joined). Streamed answers are
relayed as they arrive, so the front-end sees the reply being generated.
"""
import http.client
import http.server
import json
import sys
import threading
import time
import urllib.parse

HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te",
       "trailer", "upgrade", "content-length", "host"}
LOCK = threading.Lock()


def parse_json(raw):
    try:
        return json.loads(raw.decode("utf-8"))
    except (ValueError, UnicodeDecodeError):
        return raw.decode("utf-8", "replace")[:4000]


class Proxy(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    upstream = None
    log_path = None
    counter = 0

    def log_message(self, fmt, *args):  # quiet: the JSONL log is the record
        pass

    def _handle(self):
        started = time.time()
        length = int(self.headers.get("content-length") or 0)
        body = self.rfile.read(length) if length else b""
        up = urllib.parse.urlsplit(self.upstream)
        conn = http.client.HTTPConnection(up.hostname, up.port, timeout=900)
        headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP}
        headers["Host"] = up.netloc
        headers["Connection"] = "close"
        if body:
            headers["Content-Length"] = str(len(body))
        record = {
            "at": started,
            "method": self.command,
            "path": self.path,
            "request_headers": dict(self.headers.items()),
            "request_body": parse_json(body) if body else None,
        }
        try:
            conn.request(self.command, up.path.rstrip("/") + self.path, body=body or None,
                         headers=headers)
            resp = conn.getresponse()
        except OSError as e:
            record.update(status=502, error=str(e), total_ms=int((time.time() - started) * 1000))
            self._write(record)
            self.send_error(502, "kvmem unreachable")
            return
        record["ttfb_ms"] = int((time.time() - started) * 1000)
        record["status"] = resp.status
        record["response_headers"] = dict(resp.getheaders())
        streamed = "text/event-stream" in (resp.getheader("content-type") or "")
        self.send_response_only(resp.status, resp.reason)
        for k, v in resp.getheaders():
            if k.lower() not in HOP:
                self.send_header(k, v)
        if streamed:
            self.send_header("Transfer-Encoding", "chunked")
        else:
            data = resp.read()
            self.send_header("Content-Length", str(len(data)))
        self.send_header("Connection", "close")
        self.end_headers()
        if streamed:
            raw = bytearray()
            first_content_ms = None
            while True:
                chunk = resp.read1(65536)
                if not chunk:
                    break
                if first_content_ms is None and b'"content"' in chunk:
                    first_content_ms = int((time.time() - started) * 1000)
                raw += chunk
                try:
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                    self.wfile.flush()
                except OSError:
                    record["client_gone"] = True
                    break
            try:
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
            except OSError:
                pass
            record["first_content_ms"] = first_content_ms
            record["response_body"] = sse_summary(bytes(raw))
        else:
            try:
                self.wfile.write(data)
            except OSError:
                record["client_gone"] = True
            record["response_body"] = parse_json(data)
        record["total_ms"] = int((time.time() - started) * 1000)
        conn.close()
        self.close_connection = True
        self._write(record)

    def _write(self, record):
        with LOCK:
            Proxy.counter += 1
            record["n"] = Proxy.counter
            with open(self.log_path, "a", encoding="utf-8") as f:
                f.write(json.dumps(record, ensure_ascii=False) + "\n")

    do_GET = do_POST = do_PATCH = do_DELETE = do_PUT = _handle


def sse_summary(raw):
    """The stream's events: the first chunk (with its kvmem block), the last ones, errors,
    and the text of the content deltas joined."""
    events, text, errors = [], [], []
    event_name = None
    for line in raw.decode("utf-8", "replace").splitlines():
        if line.startswith("event:"):
            event_name = line[6:].strip()
            continue
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            events.append("[DONE]")
            continue
        try:
            obj = json.loads(data)
        except ValueError:
            events.append(data[:500])
            continue
        if event_name == "error" or "error" in obj:
            errors.append(obj)
        for choice in obj.get("choices") or []:
            piece = (choice.get("delta") or {}).get("content")
            if piece:
                text.append(piece)
        events.append(obj)
        event_name = None
    keep = [e for e in events if not (isinstance(e, dict) and e.get("choices")
            and (e["choices"][0].get("delta") or {}).get("content")
            and not e["choices"][0].get("finish_reason"))]
    return {"stream": True, "text": "".join(text), "events": keep, "errors": errors,
            "content_chunks": len(events) - len(keep)}


def main():
    port, upstream, log_path = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    Proxy.upstream = upstream
    Proxy.log_path = log_path
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Proxy)
    server.daemon_threads = True
    print(f"proxy: 127.0.0.1:{port} -> {upstream}, log {log_path}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
