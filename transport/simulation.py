"""Simulation runtime: the server driver and N client threads in one process over inproc://.

Same drivers, same framing and same validation as a deployment, without processes or TCP.
All sockets share one zmq.Context (inproc endpoints only exist within a context).

    with InprocFederation(client_ids=range(1, 9), factory=make_client) as driver:
        report = driver.run_round(PlainServer(round_id=1, clients=sorted(driver.clients), length=d))
"""
from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Callable, Iterable, Mapping

import zmq

from secagg.protocols.base import ClientProtocol
from transport.client import ClientConfig, ClientSummary, Handler, run_client
from transport.server import ServerConfig, ServerDriver

log = logging.getLogger(__name__)

ClientFactory = Callable[[int, int], "ClientProtocol | None"]
"""(client id, round id) -> that client's protocol for the round."""


class InprocFederation:
    """Context manager yielding a `ServerDriver` with all clients registered; shuts down on exit."""

    def __init__(self, *, client_ids: Iterable[int], factory: ClientFactory,
                 handlers: Callable[[int], Mapping[str, Handler]] | None = None,
                 endpoint: str | None = None, server_config: ServerConfig = ServerConfig(),
                 client_config: ClientConfig = ClientConfig(idle_timeout=None),
                 register_timeout: float = 30.0, join_timeout: float = 30.0) -> None:
        self.client_ids = tuple(sorted(set(client_ids)))
        self.factory = factory
        self.handlers = handlers
        self.endpoint = endpoint or f"inproc://secagg-{secrets.token_hex(8)}"
        self.server_config = server_config
        self.client_config = client_config
        self.register_timeout = register_timeout
        self.join_timeout = join_timeout
        self.summaries: dict[int, ClientSummary] = {}
        self.errors: dict[int, BaseException] = {}
        self._threads: list[threading.Thread] = []
        self._stop = threading.Event()

    def __enter__(self) -> ServerDriver:
        self._ctx = zmq.Context()
        self._ctx.set(zmq.MAX_SOCKETS, max(1024, 2 * len(self.client_ids) + 64))
        self.driver = ServerDriver(self.endpoint, context=self._ctx, config=self.server_config)
        for cid in self.client_ids:
            t = threading.Thread(target=self._client, args=(cid,), name=f"client-{cid}", daemon=True)
            t.start()
            self._threads.append(t)
        got = self.driver.wait_for_clients(ids=self.client_ids, timeout=self.register_timeout)
        if got != frozenset(self.client_ids):
            self.__exit__(None, None, None)
            raise TimeoutError(f"only {len(got)} of {len(self.client_ids)} clients registered")
        return self.driver

    def _client(self, cid: int) -> None:
        try:
            self.summaries[cid] = run_client(
                endpoint=self.driver.endpoint, client_id=cid, factory=lambda r: self.factory(cid, r),
                handlers=self.handlers(cid) if self.handlers else None, context=self._ctx,
                config=self.client_config, stop=self._stop)
        except BaseException as exc:  # reported to the caller via .errors
            log.exception("client %d failed", cid)
            self.errors[cid] = exc

    def __exit__(self, *exc: object) -> None:
        self.driver.shutdown()
        deadline = time.monotonic() + min(5.0, self.join_timeout)
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        self._stop.set()  # clients that missed the shutdown (e.g. not registered) stop polling
        for t in self._threads:
            t.join(self.join_timeout)
        if any(t.is_alive() for t in self._threads):
            log.error("some client threads did not stop; leaving the zmq context open")
        else:
            self._ctx.term()
