"""The floor's relay for the gateway's measurements (perf/gateway.py on the testbed, perf/gateway_gpu.py
on the GPU machine): bytes both ways, nothing parsed, uvloop. It pays per SSE event what any Python
proxy pays (a wake, a read and a write) and nothing more. Run as
`python3 -c BARE_RELAY LISTEN_HOST LISTEN_PORT UPSTREAM_HOST UPSTREAM_PORT`."""

BARE_RELAY = """
import asyncio, sys, uvloop
async def pipe(r, w):
    try:
        while data := await r.read(65536):
            w.write(data)
            await w.drain()
    except ConnectionError:
        pass
    finally:
        w.close()
async def handle(r, w):
    ur, uw = await asyncio.open_connection(sys.argv[3], int(sys.argv[4]))
    await asyncio.gather(pipe(r, uw), pipe(ur, w))
async def main():
    server = await asyncio.start_server(handle, sys.argv[1], int(sys.argv[2]))
    async with server:
        await server.serve_forever()
uvloop.run(main())
"""
