"""A stand-in W&B server for tests: the GraphQL and file-stream calls that `wandb sync` and saving
workspace views / reports make, answered from memory, every request recorded.

No network: it listens on 127.0.0.1; point W&B at it with WANDB_BASE_URL and any WANDB_API_KEY.
It implements only what wandb 0.31 and wandb-workspaces 0.4.13 use here; it is a recorder, not W&B.
"""

from __future__ import annotations

import gzip
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ENTITY = "tester"


class FakeWandb:
    def __init__(self, project: str = "attnlab") -> None:
        self.project = project
        self.requests: list[dict] = []  # {"path", "op", "variables"} for GraphQL, {"path", "body"} otherwise
        self.history: dict[str, list[dict]] = {}  # run id -> history rows as the file stream sent them
        self.summary: dict[str, dict] = {}
        self.artifacts: list[dict] = []  # {"name", "type", "aliases"} of every artifact uploaded
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def env(self) -> dict[str, str]:
        return {"WANDB_BASE_URL": self.url, "WANDB_API_KEY": "local-" + "0" * 40, "WANDB_MODE": "online",
                "WANDB_DISABLE_CODE": "true", "WANDB_ERROR_REPORTING": "false"}

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def graphql(self, op: str) -> list[dict]:
        """Variables of every GraphQL call named `op`, in order."""
        return [r["variables"] for r in self.requests if r.get("op") == op]

    # ------------------------------------------------------------------ answers
    def _answer(self, op: str, query: str, v: dict) -> dict:
        project = {"id": "UHJvamVjdDox", "name": v.get("project") or v.get("projectName") or "p",
                   "internalId": "1", "entity": {"id": "RW50aXR5OjE=", "name": ENTITY}}
        if op == "Viewer" or query.lstrip().startswith("query Viewer"):
            return {"viewer": {"id": "VXNlcjox", "entity": ENTITY, "username": ENTITY, "email": None,
                               "flags": "{}", "teams": {"edges": []}, "admin": False}}
        if op == "UpsertBucket":
            return {"upsertBucket": {"inserted": True, "bucket": {
                "id": "QnVja2V0OjE=", "name": v.get("name"), "displayName": v.get("displayName"),
                "description": "", "config": "{}", "sweepName": None, "historyLineCount": 0,
                "project": project}}}
        if op == "RunResumeStatus":
            run = v["name"]
            bucket = None if run not in self.history else {
                "id": "QnVja2V0OjE=", "name": run, "displayName": run, "summaryMetrics": json.dumps(self.summary.get(run, {})),
                "logLineCount": 0, "historyLineCount": len(self.history[run]), "eventsLineCount": 0,
                "historyTail": json.dumps([json.dumps(h) for h in self.history[run][-10:]]), "eventsTail": "[]",
                "config": "{}", "tags": [], "notes": None, "wandbConfig": json.dumps({"t": {}})}
            return {"model": {**project, "bucket": bucket}}
        if op == "CreateRunFiles":
            return {"createRunFiles": {"runID": "UnVuOjE=", "uploadHeaders": [], "files": [
                {"name": n, "uploadUrl": f"{self.url}/upload/{n}"} for n in v["files"]]}}
        if op == "CreateArtifact":
            name = v["input"]["artifactCollectionName"]
            self.artifacts.append({"name": name, "type": v["input"].get("artifactTypeName"),
                                   "aliases": [a["alias"] for a in v["input"].get("aliases") or []]})
            return {"createArtifact": {"artifact": {"id": f"QXJ0aWZhY3Q6{len(self.artifacts)}", "state": "PENDING",
                                                    "artifactSequence": {"latestArtifact": None}}}}
        if op == "CreateArtifactManifest":
            return {"createArtifactManifest": {"artifactManifest": {"id": "TWFuaWZlc3Q6MQ==", "file": {
                "id": "RmlsZTox", "uploadUrl": f"{self.url}/upload/manifest", "uploadHeaders": []}}}}
        if op == "CreateArtifactFiles":
            return {"createArtifactFiles": {"files": {"edges": [{"node": {
                "storagePath": f"storage/{i}", "uploadUrl": f"{self.url}/upload/artifact/{i}", "uploadHeaders": [],
                "uploadMultipartUrls": None, "artifact": {"id": f.get("artifactID")}}}
                for i, f in enumerate(v["input"]["artifactFiles"])]}}}
        if op == "CommitArtifact":
            return {"commitArtifact": {"artifact": {"id": v["artifactID"], "digest": "0"}}}
        if "upsertView" in query:
            return {"upsertView": {"inserted": True, "view": {
                "id": "VmlldzoxMjM=", "name": v.get("name") or "nw-view", "displayName": v.get("displayName"),
                "type": v.get("type"), "description": v.get("description", ""), "spec": v.get("spec"),
                "project": {"name": project["name"], "entityName": ENTITY},
                "createdAt": "2026-01-01T00:00:00", "updatedAt": "2026-01-01T00:00:00", "user": None}}}
        if "GetProjects" in query:  # the report's project exists already
            return {"models": {"pageInfo": {"hasNextPage": False, "endCursor": None}, "edges": [{"node": {
                "__typename": "Project", "id": "UHJvamVjdDox", "name": self.project, "entityName": ENTITY,
                "createdAt": "2026-01-01T00:00:00", "isBenchmark": False, "user": None}}]}}
        if "internalId" in query:
            return {"project": project}
        if "serverInfo" in query:
            return {"serverInfo": {"features": [], "cliVersionInfo": {}, "latestLocalVersionInfo": None}}
        return {}

    def _file_stream(self, run: str, body: dict) -> None:
        rows = self.history.setdefault(run, [])
        for name, part in (body.get("files") or {}).items():
            if name == "wandb-history.jsonl":
                offset = part["offset"]
                rows[offset:offset + len(part["content"])] = [json.loads(line) for line in part["content"]]
            elif name == "wandb-summary.json":
                self.summary[run] = json.loads(part["content"][-1])

    def _handler(self):
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def _read(self) -> bytes:
                data = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                return gzip.decompress(data) if self.headers.get("Content-Encoding") == "gzip" else data

            def _send(self, obj: dict) -> None:
                data = json.dumps(obj).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_PUT(self):  # file uploads
                self._read()
                fake.requests.append({"path": self.path})
                self._send({})

            def do_GET(self):
                fake.requests.append({"path": self.path})
                self._send({})

            def do_POST(self):
                raw = self._read()
                if self.path.startswith("/graphql"):
                    body = json.loads(raw)
                    op, v = body.get("operationName") or "", body.get("variables") or {}
                    fake.requests.append({"path": self.path, "op": op, "variables": v, "query": body.get("query", "")})
                    return self._send({"data": fake._answer(op, body.get("query", ""), v)})
                if self.path.endswith("/file_stream"):  # /files/<entity>/<project>/<run>/file_stream
                    body = json.loads(raw)
                    fake.requests.append({"path": self.path, "body": body})
                    fake._file_stream(self.path.split("/")[4], body)
                    return self._send({"exitcode": None, "limits": {}})
                fake.requests.append({"path": self.path})
                return self._send({})

        return Handler
