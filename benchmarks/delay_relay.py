"""A TCP relay that adds a fixed delay in each direction: latency emulation where tc netem is missing
(a kernel without sch_netem). Every chunk read from one side is written to the other `delay_ms`
later, in order; bandwidth and loss are not emulated.

    python -m benchmarks.delay_relay --listen 10.77.5.1:9000 --target 127.0.0.1:41234 --delay-ms 10
"""
from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Sequence


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float) -> None:
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def deliver() -> None:
        while True:
            due, chunk = await queue.get()
            if not chunk:
                break
            wait = due - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            writer.write(chunk)
            await writer.drain()
        writer.close()

    sender = asyncio.create_task(deliver())
    try:
        while chunk := await reader.read(1 << 16):
            queue.put_nowait((time.monotonic() + delay, chunk))
    except ConnectionError:
        pass
    queue.put_nowait((time.monotonic() + delay, b""))
    await sender


async def serve(listen: tuple[str, int], target: tuple[str, int], delay_ms: float) -> None:
    delay = delay_ms / 1000.0

    async def handle(client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(*target)
        except OSError:
            client_writer.close()
            return
        await asyncio.gather(_pump(client_reader, upstream_writer, delay), _pump(upstream_reader, client_writer, delay),
                             return_exceptions=True)

    server = await asyncio.start_server(handle, *listen)
    async with server:
        await server.serve_forever()


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return host, int(port)


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--listen", type=_address, required=True)
    ap.add_argument("--target", type=_address, required=True)
    ap.add_argument("--delay-ms", type=float, required=True, help="added in each direction (RTT + 2x this)")
    args = ap.parse_args(argv)
    if args.delay_ms < 0:
        ap.error("--delay-ms must be non-negative")
    try:
        asyncio.run(serve(args.listen, args.target, args.delay_ms))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
