# ruff: noqa  -- a measurement prototype, kept as it was run (bench/serving_engines/README.md)
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route
async def inv(request):
    body = await request.json()
    return JSONResponse({"ok": len(body)})
app = Starlette(routes=[Route("/invocations", inv, methods=["POST"])])
