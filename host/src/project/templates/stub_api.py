#!/usr/bin/env python3
"""A stand-in for the API this handler calls, to try it on your machine: it answers each
POST with 200 and prints the event it got.

    python3 stub_api.py                  # on 127.0.0.1:8080, where sluice.toml's api_url points
    python3 stub_api.py --fail 3         # answer 503 to the first three calls: watch the
                                         # retries wait in Redis (`sluice parked`) and come back
    python3 stub_api.py --port 9000      # elsewhere (change api_url and allowed_outbound_hosts)

Like many real APIs it refuses a body sent without a Content-Length (411).
"""

import argparse
import json
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Api(BaseHTTPRequestHandler):
    def do_POST(self):
        length = self.headers.get("content-length")
        if length is None:
            self.answer(411, {"error": "send a Content-Length with the body"})
            return
        body = self.rfile.read(int(length))
        if self.server.failures > 0:
            self.server.failures -= 1
            self.answer(503, {"error": "failing on purpose (--fail)"})
            return
        key = self.headers.get("idempotency-key", "")
        print(f"POST {self.path} idempotency-key={key} {body.decode(errors='replace')}", flush=True)
        self.answer(200, {"status": "received"})

    def answer(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass  # one line per event (above) is enough


def main():
    parser = argparse.ArgumentParser(description="A stand-in for the handler's API.")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--fail", type=int, default=0, help="answer 503 to this many calls first")
    args = parser.parse_args()
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Api)
    server.failures = args.fail
    print(f"stub API on http://127.0.0.1:{server.server_port}/events", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
