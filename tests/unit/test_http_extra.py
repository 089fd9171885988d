"""The ``http`` extra brings ``sniffio``: httpcore, httpx's transport, imports it at every
async request (``httpcore._synchronization.current_async_library``), and since anyio 4.11 no
longer depends on it, a missing ``sniffio`` made each of those imports fail, searching
``sys.path`` again every time (Python caches no failed import): about 0.1 ms of CPU per
request of ``turnstile.aio`` over HTTP (encode/httpcore#1103)."""

from __future__ import annotations

import asyncio
import tomllib
from pathlib import Path
from typing import Any

import pytest

from tests.imports import imports_made

ROOT = Path(__file__).resolve().parents[2]

httpx = pytest.importorskip("httpx")


def test_the_http_extra_names_sniffio() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    http = project["project"]["optional-dependencies"]["http"]
    assert any(req.startswith("sniffio") for req in http), http


def test_async_requests_import_nothing_anew() -> None:
    """Requests after the first through httpx's async client look up no module: with sniffio
    installed, httpcore's per-request ``import sniffio`` is a ``sys.modules`` hit."""

    async def main() -> list[str]:
        finished: list[asyncio.Event] = []

        async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            done = asyncio.Event()
            finished.append(done)
            try:
                while await reader.readuntil(b"\r\n\r\n"):
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                    await writer.drain()
            except (asyncio.IncompleteReadError, ConnectionError):
                pass
            finally:
                writer.close()
                done.set()

        server = await asyncio.start_server(answer, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            async with httpx.AsyncClient() as client:
                url = f"http://127.0.0.1:{port}/"
                assert (await client.get(url)).text == "ok"  # imports made once are made here
                with imports_made() as asked:
                    for _ in range(5):
                        assert (await client.get(url)).text == "ok"
            # The client closed its connection: the handler sees the end of its stream.
            for done in finished:
                await asyncio.wait_for(done.wait(), 10)
        finally:
            server.close()
            await server.wait_closed()
        return asked

    asked: Any = asyncio.run(main())
    assert asked == [], f"imported at every request: {sorted(set(asked))}"
