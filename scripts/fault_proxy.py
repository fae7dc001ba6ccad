#!/usr/bin/env python3
"""A fault-injecting HTTP proxy for weightbay's object-store tests (stdlib only).

One process, started by `scripts/servers.sh start proxy`, listens on a control port. A test
asks it for a proxy of its own, in front of a real server on 127.0.0.1, with the faults it
wants:

    POST /proxies  {"upstream": "http://127.0.0.1:PORT", "faults": {...}}  ->  {"port": N}
    GET /proxies/N                                                          ->  counts
    DELETE /proxies/N

and talks to 127.0.0.1:N as if it were the server. Faults (all optional):

    "seed": 7                      random shares below are drawn from this seed
    "status_share": 0.1            share of requests answered without forwarding...
    "status": 503                  ...with this status: 503 is S3's SlowDown (XML body), 429 too
                                   many requests; anything else an S3-style XML error
    "reset_share": 0.01            share of responses cut after half their body (TCP reset)
    "request_reset_share": 0.01    share of requests whose connection is reset after half
                                   their body has been read (never forwarded)
    "latency_ms": 20               added before each request is forwarded
    "stall": {"match": "partNumber=2", "times": 1}
                                   requests whose request line contains `match` get no
                                   response at all (the first `times` of them; -1: all) until
                                   the client gives up or `max_stall_s` (default 300) passes
    "cut": {"match": "?uploadId=", "times": 1}
                                   the responses to the first `times` matching requests are cut
                                   after half their body (the request has been served)
    "fail": {"match": "PUT ", "times": 2, "status": 403, "code": "AccessDenied"}
                                   the first `times` matching requests are answered with this
                                   status and S3 error code
    "slow": {"match": "?uploadId=", "times": 1, "seconds": 4}
                                   the first `times` matching requests are served, and their
                                   answer sent `seconds` later: a store that takes long over
                                   one kind of request (joining a large upload's parts)
    "rate_limit": {"per_second": 3500, "depth": 2}
                                   requests beyond `per_second` in one second for one key
                                   prefix (the first `depth` path segments) answered 503
    "hold_share": 0.08             share of requests forwarded and served whose response is
                                   then held: nothing is sent until the client hangs up
    "half_body_stall_share": 0.05  share of responses that stop after half their body and
                                   send nothing more until the client hangs up
    "drip_share": 0.05             share of responses whose body trickles at `drip_bytes_per_s`
    "drip_bytes_per_s": 16         (default 16) after its first half comes at full speed
    "slow_first_byte_share": 0.05  share of responses sent only after `slow_first_byte_s`
    "slow_first_byte_s": 5         (default 5) seconds
    "share_methods": ["GET"]       the five shares above apply only to requests of these methods
                                   (default: all)
    "bandwidth_bytes_per_s": N     every response body and every request body is carried at
                                   no more than N bytes a second per connection: a uniformly
                                   slow link, which no client should take for a stall

Everything listens on 127.0.0.1 only. Each proxy counts what it did: requests, forwarded,
and each fault injected.
"""

import argparse
import http.client
import json
import os
import random
import socket
import struct
import sys
import threading
import time
from urllib.parse import urlsplit

HOST = "127.0.0.1"
SLOWDOWN = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
    b"<Message>Please reduce your request rate.</Message></Error>"
)


def error_body(code, message):
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>%s</Code><Message>%s</Message></Error>'
        % (code, message)
    ).encode()


REASONS = {403: "Forbidden", 404: "Not Found", 429: "Too Many Requests", 500: "Internal Server Error",
           503: "Slow Down"}


def read_head(sock_file):
    """The request line and headers, or None at a clean end of the connection."""
    line = sock_file.readline(65537)
    if not line:
        return None
    request_line = line.decode("latin-1").rstrip("\r\n")
    headers = []
    while True:
        line = sock_file.readline(65537)
        if not line or line in (b"\r\n", b"\n"):
            break
        name, _, value = line.decode("latin-1").partition(":")
        headers.append((name.strip(), value.strip()))
    return request_line, headers


def header(headers, name):
    for key, value in headers:
        if key.lower() == name:
            return value
    return None


def read_body(sock_file, headers, limit=None):
    """The request body (Content-Length or chunked); `limit` stops after that many bytes."""
    length = header(headers, "content-length")
    if length is not None:
        n = int(length)
        if limit is not None:
            n = min(n, limit)
        return sock_file.read(n)
    if (header(headers, "transfer-encoding") or "").lower() == "chunked":
        chunks = []
        while True:
            size = int(sock_file.readline().split(b";")[0], 16)
            if size == 0:
                while sock_file.readline() not in (b"\r\n", b"\n", b""):
                    pass
                return b"".join(chunks)
            chunks.append(sock_file.read(size))
            sock_file.readline()
    return b""


def reset(sock):
    """Closes with a TCP reset, as a dropped connection does."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    sock.close()


class Proxy:
    def __init__(self, upstream, faults):
        url = urlsplit(upstream)
        if url.hostname not in ("127.0.0.1", "localhost", "::1"):
            raise ValueError("upstream must be on loopback, got %r" % upstream)
        self.upstream = (url.hostname, url.port or 80)
        self.faults = faults
        self.random = random.Random(faults.get("seed", 0))
        self.lock = threading.Lock()
        self.counts = {"requests": 0, "forwarded": 0, "status": 0, "reset": 0, "request_reset": 0,
                       "stalled": 0, "failed": 0, "rate_limited": 0, "held": 0,
                       "half_body_stalled": 0, "dripped": 0, "slow_first_byte": 0, "slow": 0}
        self.stalls_left = (faults.get("stall") or {}).get("times", 0)
        self.fails_left = (faults.get("fail") or {}).get("times", 0)
        self.cuts_left = (faults.get("cut") or {}).get("times", 0)
        self.slows_left = (faults.get("slow") or {}).get("times", 0)
        self.windows = {}
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind((HOST, 0))
        self.listener.listen(256)
        self.port = self.listener.getsockname()[1]
        self.closed = False
        threading.Thread(target=self.accept, daemon=True).start()

    def count(self, what):
        with self.lock:
            self.counts[what] += 1

    def draw(self, share_key, method=None):
        share = self.faults.get(share_key, 0)
        if not share:
            return False
        methods = self.faults.get("share_methods")
        if method is not None and methods is not None and method not in methods:
            return False
        with self.lock:
            return self.random.random() < share

    def take(self, spec_key, left_attr, request_line):
        spec = self.faults.get(spec_key)
        if not spec or spec.get("match", "") not in request_line:
            return None
        with self.lock:
            left = getattr(self, left_attr)
            if left == 0:
                return None
            if left > 0:
                setattr(self, left_attr, left - 1)
        return spec

    def over_rate(self, target):
        spec = self.faults.get("rate_limit")
        if not spec:
            return False
        path = urlsplit(target).path
        prefix = "/".join(path.split("/")[: spec.get("depth", 2) + 1])
        second = int(time.monotonic())
        with self.lock:
            window = self.windows.get(prefix)
            if window is None or window[0] != second:
                window = [second, 0]
                self.windows[prefix] = window
            window[1] += 1
            return window[1] > spec["per_second"]

    def accept(self):
        while not self.closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self.serve, args=(client,), daemon=True).start()

    def close(self):
        self.closed = True
        try:
            self.listener.close()
        except OSError:
            pass

    def serve(self, client):
        client.settimeout(self.faults.get("max_stall_s", 300))
        upstream = None
        reader = client.makefile("rb")
        try:
            while True:
                head = read_head(reader)
                if head is None:
                    return
                request_line, headers = head
                method, target, _ = (request_line.split(" ", 2) + ["", ""])[:3]
                self.count("requests")
                if self.draw("request_reset_share"):
                    length = int(header(headers, "content-length") or 0)
                    read_body(reader, headers, limit=length // 2)
                    self.count("request_reset")
                    reset(client)
                    return
                started = time.monotonic()
                body = read_body(reader, headers)
                self.pace(started, len(body))
                if self.take("stall", "stalls_left", request_line):
                    self.count("stalled")
                    self.hold(reader)
                    return
                failure = self.take("fail", "fails_left", request_line)
                if failure:
                    self.count("failed")
                    status = failure.get("status", 503)
                    body_out = error_body(failure.get("code", "InternalError"),
                                          failure.get("message", "injected by the fault proxy"))
                    self.answer(client, status, body_out)
                    continue
                if self.over_rate(target):
                    self.count("rate_limited")
                    self.answer(client, 503, SLOWDOWN)
                    continue
                if self.draw("status_share"):
                    self.count("status")
                    status = self.faults.get("status", 503)
                    self.answer(client, status, SLOWDOWN if status == 503 else
                                error_body("TooManyRequests" if status == 429 else "InternalError",
                                           "injected by the fault proxy"))
                    continue
                latency = self.faults.get("latency_ms", 0)
                if latency:
                    time.sleep(latency / 1000)
                if upstream is None:
                    upstream = http.client.HTTPConnection(*self.upstream, timeout=600)
                forward = [(k, v) for k, v in headers
                           if k.lower() not in ("connection", "transfer-encoding", "content-length",
                                                "keep-alive", "proxy-connection")]
                forward.append(("Content-Length", str(len(body))))
                try:
                    upstream.putrequest(method, target, skip_host=True, skip_accept_encoding=True)
                    for k, v in forward:
                        upstream.putheader(k, v)
                    upstream.endheaders(body)
                    response = upstream.getresponse()
                    payload = response.read()
                except (OSError, http.client.HTTPException):
                    upstream.close()
                    upstream = None
                    reset(client)
                    return
                self.count("forwarded")
                # A HEAD answer's length is the object's: keep it.
                dropped = ("connection", "transfer-encoding", "keep-alive") + (
                    () if method == "HEAD" else ("content-length",))
                out_headers = [(k, v) for k, v in response.getheaders() if k.lower() not in dropped]
                cut = method != "HEAD" and len(payload) > 1 and (
                    self.take("cut", "cuts_left", request_line) or self.draw("reset_share"))
                if self.draw("hold_share", method):
                    self.count("held")
                    self.hold(reader)
                    return
                slow = self.take("slow", "slows_left", request_line)
                if slow:
                    self.count("slow")
                    time.sleep(slow.get("seconds", 4))
                if self.draw("slow_first_byte_share", method):
                    self.count("slow_first_byte")
                    time.sleep(self.faults.get("slow_first_byte_s", 5))
                shape = None
                if method != "HEAD" and len(payload) > 1 and not cut:
                    if self.draw("half_body_stall_share", method):
                        shape = "half_body_stalled"
                    elif self.draw("drip_share", method):
                        shape = "dripped"
                if shape:
                    self.count(shape)
                    self.answer(client, response.status, payload, out_headers,
                                reason=response.reason, shape=shape, reader=reader)
                    return
                self.answer(client, response.status, payload, out_headers, reason=response.reason,
                            cut=cut, head=method == "HEAD")
                if cut:
                    self.count("reset")
                    return
        except (OSError, ValueError):
            return
        finally:
            if upstream is not None:
                upstream.close()
            try:
                client.close()
            except OSError:
                pass

    @staticmethod
    def hold(reader):
        """Sends nothing more: waits until the client hangs up (or max_stall_s passes)."""
        try:
            while reader.read(1):
                pass
        except OSError:
            pass

    def pace(self, started, length):
        """Holds a transfer of `length` bytes begun at `started` to the bandwidth cap."""
        cap = self.faults.get("bandwidth_bytes_per_s")
        if cap:
            left = started + length / cap - time.monotonic()
            if left > 0:
                time.sleep(left)

    def send(self, client, data):
        """Sends `data`, at no more than the bandwidth cap."""
        cap = self.faults.get("bandwidth_bytes_per_s")
        if not cap:
            client.sendall(data)
            return
        chunk = max(1, cap // 20)
        started = time.monotonic()
        for at in range(0, len(data), chunk):
            client.sendall(data[at:at + chunk])
            self.pace(started, at + chunk)

    def answer(self, client, status, body, headers=(), reason=None, cut=False, head=False,
               shape=None, reader=None):
        reason = reason or REASONS.get(status, "Error")
        lines = ["HTTP/1.1 %d %s" % (status, reason)]
        lines += ["%s: %s" % (k, v) for k, v in headers]
        if not any(k.lower() == "content-type" for k, _ in headers) and status >= 400:
            lines.append("Content-Type: application/xml")
        if not head:
            lines.append("Content-Length: %d" % len(body))
        data = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        if head:
            client.sendall(data)
        elif cut:
            self.send(client, data + body[: len(body) // 2])
            reset(client)
        elif shape == "half_body_stalled":
            self.send(client, data + body[: len(body) // 2])
            self.hold(reader)
        elif shape == "dripped":
            self.send(client, data + body[: len(body) // 2])
            rate = self.faults.get("drip_bytes_per_s", 16)
            for at in range(len(body) // 2, len(body), rate):
                client.sendall(body[at:at + rate])
                time.sleep(1)
        else:
            self.send(client, data + body)


class Control:
    def __init__(self, port):
        self.proxies = {}
        self.lock = threading.Lock()
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind((HOST, port))
        self.listener.listen(64)
        self.port = self.listener.getsockname()[1]

    def run(self):
        while True:
            client, _ = self.listener.accept()
            threading.Thread(target=self.serve, args=(client,), daemon=True).start()

    def serve(self, client):
        with client:
            reader = client.makefile("rb")
            head = read_head(reader)
            if head is None:
                return
            request_line, headers = head
            method, target = request_line.split(" ")[:2]
            body = read_body(reader, headers)
            try:
                status, answer = self.handle(method, target, body)
            except (ValueError, KeyError) as e:
                status, answer = 400, {"error": str(e)}
            data = json.dumps(answer).encode()
            client.sendall(b"HTTP/1.1 %d X\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
                           b"Connection: close\r\n\r\n%s" % (status, len(data), data))

    def handle(self, method, target, body):
        parts = [p for p in target.split("/") if p]
        if parts == ["health"]:
            return 200, {"proxies": len(self.proxies)}
        if method == "POST" and parts == ["proxies"]:
            spec = json.loads(body or b"{}")
            proxy = Proxy(spec["upstream"], spec.get("faults", {}))
            with self.lock:
                self.proxies[proxy.port] = proxy
            return 200, {"port": proxy.port}
        if len(parts) == 2 and parts[0] == "proxies":
            port = int(parts[1])
            with self.lock:
                proxy = self.proxies.get(port)
                if proxy is not None and method == "DELETE":
                    del self.proxies[port]
            if proxy is None:
                return 404, {"error": "no proxy on port %d" % port}
            if method == "DELETE":
                proxy.close()
            with proxy.lock:
                return 200, dict(proxy.counts)
        return 404, {"error": "unknown request %s %s" % (method, target)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--port-file")
    args = parser.parse_args()
    control = Control(args.port)
    if args.port_file:
        with open(args.port_file + ".tmp", "w") as f:
            f.write(str(control.port))
        os.replace(args.port_file + ".tmp", args.port_file)
    print("fault proxy control on %s:%d" % (HOST, control.port), file=sys.stderr, flush=True)
    control.run()


if __name__ == "__main__":
    main()
