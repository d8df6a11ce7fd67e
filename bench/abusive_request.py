"""Issue 29's abusive request, measured: 768 copies of a 16 KB PNG whose header declares 4096 x 4096
pixels (16.4 MB of JSON, under every byte limit, 12.9 billion pixels declared), sent through
`pipeline.serve_guard` to `mlflow models serve`; prints the answer's status, its time and the server's
peak RSS (its process tree, sampled every 0.2 s).

    python -m bench.abusive_request <repo>      # a workspace whose mlflow.db holds fashion-cascade@champion
"""
import base64
import json
import os
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.request
import zlib

def png_claiming(width, height, payload=16_000):
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xffffffff)
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    idat = os.urandom(payload)  # 16 KB that no decoder should ever reach: the header alone is over budget
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")

def port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p

repo = sys.argv[1] if len(sys.argv) > 1 else "."
env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{repo}/mlflow.db"}
up, front = port(), port()
server = subprocess.Popen([os.path.join(os.path.dirname(sys.executable), "mlflow"), "models", "serve", "-m", "models:/fashion-cascade@champion",
                           "--env-manager", "local", "--host", "127.0.0.1", "--port", str(up)], cwd=repo, env=env,
                          stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
guard = subprocess.Popen([sys.executable, "-m", "pipeline.serve_guard", "--upstream", f"http://127.0.0.1:{up}",
                          "--port", str(front), "--quiet"], cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
peak = [0]
def watch():
    while server.poll() is None:
        total = 0
        for pid in [server.pid] + [int(p) for p in subprocess.run(["pgrep", "-P", str(server.pid)], capture_output=True, text=True).stdout.split()]:
            try:
                total += int(open(f"/proc/{pid}/status").read().split("VmRSS:")[1].split()[0])
            except Exception:
                pass
        peak[0] = max(peak[0], total); time.sleep(0.2)
threading.Thread(target=watch, daemon=True).start()
try:
    for _ in range(300):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{front}/ping", timeout=2); break
        except Exception:
            time.sleep(0.5)
    one = base64.b64encode(png_claiming(4096, 4096)).decode()
    body = json.dumps({"dataframe_split": {"columns": ["image"], "data": [[one]] * 768}}).encode()
    print(f"body {len(body):,} bytes")
    start = time.perf_counter()
    req = urllib.request.Request(f"http://127.0.0.1:{front}/invocations", data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            status, answer = r.status, r.read()
    except urllib.error.HTTPError as e:
        status, answer = e.code, e.read()
    print(json.dumps({"status": status, "seconds": round(time.perf_counter() - start, 2), "answer_bytes": len(answer),
                      "answer": answer[:200].decode(errors="replace"), "server_peak_rss_mb": round(peak[0] / 1024)}))
finally:
    guard.terminate(); server.terminate(); server.wait(20)
