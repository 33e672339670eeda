#!/usr/bin/env python3
"""A stand-in for the Kubernetes API server, for integration/tests/installer.rs.

It speaks HTTPS (HTTP/1.1, a certificate the test made with openssl) and
answers the two requests nri-shim-installer makes as the API server would,
for the objects in its state directory:

- PATCH /api/v1/nodes/NAME with Content-Type application/merge-patch+json:
  the JSON merge patch (RFC 7386) applied to nodes.json's node, which is
  written back; the node is returned;
- GET /api/v1/nodes/NAME: the node;
- GET /apis/apps/v1/namespaces/NS/daemonsets/NAME: daemonsets.json's object
  "NS/NAME" (read on every request: the test deletes it there), else 404.

A request without `Authorization: Bearer <token>` gets 401, an unknown path
404, another patch type 415, each with a Status object as the API's. Every
request is appended to requests.jsonl. What it does not do: RBAC, admission
(the own-node policy), watches, resource versions.

usage: fake-kube-apiserver.py STATE_DIR CERT KEY TOKEN
(prints the port it listens on, on 127.0.0.1, as its first line)
"""

import http.server
import json
import os
import re
import ssl
import sys
import threading


def merge_patch(target, patch):
    if not isinstance(patch, dict):
        return patch
    if not isinstance(target, dict):
        target = {}
    out = dict(target)
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge_patch(out.get(k), v)
    return out


def main():
    state, cert, key, token = sys.argv[1:5]
    lock = threading.Lock()

    def load(name):
        with open(os.path.join(state, name)) as f:
            return json.load(f)

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def reply(self, code, obj):
            body = json.dumps(obj).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def status(self, code, reason, message):
            self.reply(code, {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                              "message": message, "reason": reason, "code": code})

        def record(self, body):
            with lock, open(os.path.join(state, "requests.jsonl"), "a") as f:
                f.write(json.dumps({
                    "method": self.command, "path": self.path,
                    "content_type": self.headers.get("Content-Type"),
                    "authorized": self.authorized(), "body": body}) + "\n")

        def authorized(self):
            return self.headers.get("Authorization") == "Bearer " + token

        def handle_any(self):
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length).decode() if length else ""
            self.record(body)
            if not self.authorized():
                return self.status(401, "Unauthorized", "Unauthorized")
            m = re.fullmatch(r"/api/v1/nodes/([^/?]+)", self.path)
            if m:
                name = m.group(1)
                with lock:
                    nodes = load("nodes.json")
                    if name not in nodes:
                        return self.status(404, "NotFound", f'nodes "{name}" not found')
                    if self.command == "GET":
                        return self.reply(200, nodes[name])
                    if self.command != "PATCH":
                        return self.status(405, "MethodNotAllowed", self.command)
                    if self.headers.get("Content-Type") != "application/merge-patch+json":
                        return self.status(415, "UnsupportedMediaType",
                                           f"the body of the request was in an unknown format - accepted media types include: application/merge-patch+json")
                    try:
                        patch = json.loads(body)
                    except ValueError as e:
                        return self.status(400, "BadRequest", f"error decoding patch: {e}")
                    nodes[name] = merge_patch(nodes[name], patch)
                    tmp = os.path.join(state, "nodes.json.tmp")
                    with open(tmp, "w") as f:
                        json.dump(nodes, f)
                    os.rename(tmp, os.path.join(state, "nodes.json"))
                    return self.reply(200, nodes[name])
            m = re.fullmatch(r"/apis/apps/v1/namespaces/([^/]+)/daemonsets/([^/?]+)", self.path)
            if m and self.command == "GET":
                ds = load("daemonsets.json").get(f"{m.group(1)}/{m.group(2)}")
                if ds is None:
                    return self.status(404, "NotFound", f'daemonsets.apps "{m.group(2)}" not found')
                return self.reply(200, ds)
            return self.status(404, "NotFound", f"the server could not find the requested resource ({self.path})")

        do_GET = do_PATCH = do_PUT = do_POST = do_DELETE = handle_any

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    print(server.server_address[1], flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
