"""A small model server for the gateway's end-to-end tests: Python's standard library only.

Listens on $PORT (the agent's choice). GET /health answers 200 once it is up; POST
/v1/completions answers an OpenAI-style completion whose text is a seeded function of the
prompt, with a `usage` object (prompt and completion tokens: whitespace words), and names the
replica that answered (its lease) in `replica`; a request's `delay_ms` makes it take that long
(load for the autoscaler). GET /v1/stream sends five server-sent events,
one every 50 ms.
"""

import json
import os
import random
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

REPLICA = os.environ.get("FALLOW_LEASE_ID", "?")
WORDS = ["fallow", "gpu", "lease", "market", "rack", "idle", "window", "token"]


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def send_json(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/health":
            self.send_json(200, {"ok": True, "replica": REPLICA})
        elif self.path == "/v1/stream":
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()
            for index in range(5):
                event = f"data: {index}\n\n".encode()
                self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
                self.wfile.flush()
                time.sleep(0.05)
            self.wfile.write(b"0\r\n\r\n")
        else:
            self.send_json(404, {"error": "no such path"})

    def do_POST(self):
        length = int(self.headers.get("content-length", "0"))
        request = json.loads(self.rfile.read(length) or b"{}")
        if self.path != "/v1/completions":
            self.send_json(404, {"error": "no such path"})
            return
        time.sleep(float(request.get("delay_ms", 0)) / 1000)
        prompt = str(request.get("prompt", ""))
        count = int(request.get("max_tokens", 8))
        rng = random.Random(prompt)
        text = " ".join(rng.choice(WORDS) for _ in range(count))
        prompt_tokens = len(prompt.split())
        self.send_json(200, {
            "object": "text_completion",
            "replica": REPLICA,
            "choices": [{"index": 0, "text": text, "finish_reason": "length"}],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": count,
                "total_tokens": prompt_tokens + count,
            },
        })


class Server(ThreadingHTTPServer):
    # A model server's accept queue, not the standard library's 5.
    request_queue_size = 256
    daemon_threads = True


if __name__ == "__main__":
    Server(("0.0.0.0", int(os.environ["PORT"])), Handler).serve_forever()
