# ruff: noqa  -- a measurement prototype, kept as it was run (bench/serving_engines/README.md)
from fastapi import FastAPI, Request
app = FastAPI()
@app.post("/invocations")
async def inv(request: Request):
    body = await request.json()
    return {"ok": len(body)}
