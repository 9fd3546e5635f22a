#!/usr/bin/env python3
"""Records a HAR with headless Chromium: a loopback page whose script calls an API that answers
{"status":1401} to an old token, refreshes once at /oauth/token, and sends again.

Usage: chromium_har.py OUT.har CHROMIUM [REQUESTS] [MODE]

Serves the page, the API and the token endpoint itself (standard library, 127.0.0.1, a free
port), then has Chromium (Debian's, driven by Playwright, which records the HAR from Chromium's
own network events: headless Chromium has no HAR export of its own) load the page and wait until
its script is done. MODE "storm" (default): REQUESTS fetches at once with the old token; each 1401
waits for one shared refresh, then is sent again with the new token. MODE "logout": the API
answers {"status":202} and the page stops. Prints one JSON line: {"token_calls": n, "api_calls": n}.
"""

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from playwright.sync_api import sync_playwright

OUT, CHROMIUM = sys.argv[1], sys.argv[2]
REQUESTS = int(sys.argv[3]) if len(sys.argv) > 3 else 10
MODE = sys.argv[4] if len(sys.argv) > 4 else "storm"

PAGE = """<!doctype html><html><head><title>replay</title><link rel="icon" href="data:,"></head><body><script>
let token = "old-token";
let refreshing = null;
function refresh() {
  if (!refreshing) {
    refreshing = fetch("/oauth/token", {method: "POST",
        headers: {"Content-Type": "application/x-www-form-urlencoded"},
        body: "grant_type=refresh_token&refresh_token=page-refresh-secret"})
      .then(r => r.json()).then(j => { token = j.access_token; });
  }
  return refreshing;
}
async function call(i) {
  for (let attempt = 0; attempt < 2; attempt++) {
    const r = await fetch("/api/item/" + i, {headers: {"Authorization": "Bearer " + token}});
    const j = await r.json();
    if (j.status === 1401 && attempt === 0) { await refresh(); continue; }
    return j.status;
  }
}
(async () => {
  const n = %d;
  const results = await Promise.all([...Array(n).keys()].map(call));
  document.title = "done " + results.join(",");
})();
</script></body></html>"""

lock = threading.Lock()
counts = {"token_calls": 0, "api_calls": 0}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def reply(self, status, body, content_type="application/json"):
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/":
            self.reply(200, PAGE % REQUESTS, "text/html")
        elif self.path.startswith("/api/"):
            with lock:
                counts["api_calls"] += 1
            if MODE == "logout":
                self.reply(200, '{"status":202}')
            elif self.headers.get("Authorization") == "Bearer new-page-token":
                self.reply(200, '{"status":0}')
            else:
                self.reply(200, '{"status":1401}')
        else:
            self.reply(404, '{"error":"not found"}')

    def do_POST(self):
        length = int(self.headers.get("Content-Length", "0"))
        self.rfile.read(length)
        if self.path == "/oauth/token":
            with lock:
                counts["token_calls"] += 1
            self.reply(200, '{"access_token":"new-page-token","token_type":"Bearer","expires_in":3600,'
                            '"refresh_token":"rotated-page-secret"}')
        else:
            self.reply(404, "{}")


server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
threading.Thread(target=server.serve_forever, daemon=True).start()
url = "http://127.0.0.1:%d/" % server.server_address[1]

with sync_playwright() as playwright:
    browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
    context = browser.new_context(record_har_path=OUT, record_har_content="embed")
    page = context.new_page()
    page.goto(url)
    if MODE == "logout":
        page.wait_for_function("document.title.startsWith('done') || performance.now() > 1500", timeout=15000)
    else:
        page.wait_for_function("document.title.startsWith('done')", timeout=15000)
    context.close()
    browser.close()
server.shutdown()
print(json.dumps(counts))
