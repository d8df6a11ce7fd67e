"""The user's path, timed end to end on a fresh clone: an image folder -> the quick profile's pipeline
(`python -m pipeline.profiles --profile quick --data imagefolder:<folder>`, what `make repro
PROFILE=quick DATA=...` runs) -> a registered model named after the folder -> `cascade recognize
--model models:/<name>@champion` -> `mlflow models serve` behind `pipeline.serving.mlflow_guard` answering a
REST call. Each phase's wall time goes to bench/out/quickstart.json.

    python -m bench.quickstart                         # 200 Fashion-MNIST PNGs per class (2,000 images)
    python -m bench.quickstart --per-class 20          # a smaller folder (what the test runs)
    python -m bench.quickstart --images /my/folder     # your own folder (one sub-folder per class)

The clone is made from this repository's HEAD into a temporary directory (its .venv linked), so the
run never touches this workspace. Run it alone: the machine's other load shows up in the times.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]


def export_fashion_folder(folder: Path, per_class: int, seed: int = 0) -> Path:
    """``per_class`` Fashion-MNIST training images of each class as PNGs, one sub-folder per class."""
    from pipeline.data.sources import load_fashion_mnist

    data = load_fashion_mnist()
    rng = np.random.default_rng(seed)
    for c, name in enumerate(data.classes):
        rows = rng.choice(np.flatnonzero(data.train.labels == c), size=per_class, replace=False)
        out = folder / name.replace("/", "-")
        out.mkdir(parents=True, exist_ok=True)
        for i, row in enumerate(rows):
            Image.fromarray(data.train.images[row, 0]).save(out / f"{i:04d}.png")
    return folder


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run(cmd: list[str], cwd: Path, env: dict[str, str], log: Path) -> float:
    """Run ``cmd``, its output to ``log``; its wall seconds, or SystemExit naming the log on failure."""
    started = time.perf_counter()
    with open(log, "w") as fh:
        status = subprocess.call(cmd, cwd=cwd, env=env, stdout=fh, stderr=subprocess.STDOUT)
    if status != 0:
        tail = log.read_text()[-3000:]
        raise SystemExit(f"quickstart: {' '.join(cmd)} failed (exit {status}); log {log}:\n{tail}")
    return time.perf_counter() - started


def wait_ready(url: str, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as reply:
                if reply.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise SystemExit(f"quickstart: {url} did not answer within {seconds:g} s")


def serve_and_call(repo: Path, env: dict[str, str], model_uri: str, image: Path, logs: Path) -> tuple[float, dict]:
    """Start the model server and the guard, send one REST request through the guard; (seconds from the
    serve command to the answer, the answer's first row)."""
    upstream, front = free_port(), free_port()
    started = time.perf_counter()
    procs = [subprocess.Popen([str(repo / ".venv/bin/mlflow"), "models", "serve", "-m", model_uri, "--env-manager",
                               "local", "--host", "127.0.0.1", "--port", str(upstream)], cwd=repo, env=env,
                              stdout=open(logs / "serve.log", "w"), stderr=subprocess.STDOUT),
             subprocess.Popen([sys.executable, "-m", "pipeline.serving.mlflow_guard", "--upstream",
                               f"http://127.0.0.1:{upstream}", "--port", str(front), "--quiet"], cwd=repo, env=env,
                              stdout=open(logs / "guard.log", "w"), stderr=subprocess.STDOUT)]
    try:
        wait_ready(f"http://127.0.0.1:{front}/ping", 180)
        body = json.dumps({"dataframe_split": {"columns": ["image"], "data": [[
            base64.b64encode(image.read_bytes()).decode("ascii")]]}}).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{front}/invocations", data=body,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=120) as reply:
            answer = json.loads(reply.read())
        return time.perf_counter() - started, answer["predictions"][0]
    finally:
        for proc in procs:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--images", type=Path, default=None, help="an image folder (default: Fashion-MNIST PNGs)")
    p.add_argument("--per-class", type=int, default=200, help="Fashion-MNIST images per class (default 200)")
    p.add_argument("--profile", default="quick")
    p.add_argument("--keep", action="store_true", help="keep the temporary clone (its path is printed)")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "quickstart.json")
    args = p.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="cascade-quickstart-"))
    try:
        folder = args.images or export_fashion_folder(work / "my-images", args.per_class)
        repo = work / "repo"
        subprocess.run(["git", "clone", "--quiet", str(ROOT), str(repo)], check=True)
        (repo / ".venv").symlink_to(ROOT / ".venv")
        env = {**os.environ, "PATH": f"{repo / '.venv' / 'bin'}{os.pathsep}{os.environ['PATH']}",
               "DVC_NO_ANALYTICS": "1", "MLFLOW_ENABLE_TELEMETRY": "false", "GX_ANALYTICS_ENABLED": "false"}
        env["MLFLOW_TRACKING_URI"] = f"sqlite:///{repo / 'mlflow.db'}"  # the clone's own store
        times = {"pipeline_s": run([sys.executable, "-m", "pipeline.profiles", "--profile", args.profile, "--data",
                                    f"imagefolder:{folder.resolve()}"], repo, env, work / "pipeline.log")}
        registered = json.loads((repo / "metrics" / "register.json").read_text())
        uri = f"models:/{registered['model_name']}@champion"
        image = next(p for p in sorted(folder.rglob("*")) if p.suffix.lower() in (".png", ".jpg", ".jpeg"))
        started = time.perf_counter()
        answer = subprocess.run([str(repo / ".venv/bin/cascade"), "recognize", "--model", uri, "--json", str(image)],
                                cwd=repo, env=env, capture_output=True, text=True, check=True).stdout
        times["recognize_s"] = time.perf_counter() - started
        times["serve_and_rest_call_s"], row = serve_and_call(repo, env, uri, image, work)
        headline = json.loads((repo / "metrics" / "headline.json").read_text())
        result = {"images": sum(1 for q in folder.rglob("*") if q.is_file()), "model_uri": uri,
                  "recognized": json.loads(answer)[0]["class_name"], "rest_answer": row["class_name"],
                  "test_accuracy": headline["acc"], "two_cnn_accuracy": headline.get("cnn2_acc"),
                  **{k: round(v, 1) for k, v in times.items()},
                  "total_s": round(sum(times.values()), 1)}
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
        print(json.dumps(result, indent=2))
        print(f"wrote {args.out}")
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
