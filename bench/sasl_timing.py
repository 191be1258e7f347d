"""SASL answer times for known and unknown users: does timing tell who exists?

    .venv/bin/python bench/sasl_timing.py [--tries 40] [--json FILE]

Starts an in-process broker with a SASL_PLAINTEXT listener (PLAIN, SCRAM-SHA-512) and
one user, then times over real sockets, alternating known and unknown users:

- SCRAM client-first -> server-first (the step that used to answer an unknown user
  with error 58 after the failed-login delay, a known one in about 1 ms);
- SCRAM client-final with a wrong proof -> error 58 (both users fail here now);
- PLAIN with a wrong password -> error 58 (an unknown user's password is salted too).

Prints the median and the 10th/90th percentiles per case in milliseconds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import trio
from scramp import ScramClient

from trio_broker.config import BrokerConfig
from trio_broker.protocol import messages as m
from trio_broker.security.credentials import CredentialStore
from trio_broker.server.broker import Broker

MECH = "SCRAM-SHA-512"


class Client:
    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream, self.buf, self.cid = stream, bytearray(), 0

    async def call(self, api_key: int, version: int, body: Any) -> tuple[Any, float]:
        self.cid += 1
        started = time.perf_counter()
        await self.stream.send_all(m.encode_request(api_key, version, self.cid, "t", body))
        while len(self.buf) < 4 or len(self.buf) < 4 + int.from_bytes(self.buf[:4], "big"):
            chunk = await self.stream.receive_some(65536)
            if not chunk:
                raise ConnectionError("closed")
            self.buf += chunk
        size = int.from_bytes(self.buf[:4], "big")
        frame, self.buf = bytes(self.buf[4 : 4 + size]), self.buf[4 + size :]
        elapsed_ms = (time.perf_counter() - started) * 1000
        return m.decode_response(api_key, version, frame)[1], elapsed_ms


async def one(port: int, mech: str, user: str, password: str) -> dict[str, float]:
    async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
        client = Client(stream)
        await client.call(17, 1, m.SaslHandshakeRequest(mechanism=mech))
        if mech == "PLAIN":
            token = f"\0{user}\0{password}".encode()
            answer, ms = await client.call(36, 2, m.SaslAuthenticateRequest(auth_bytes=token))
            return {"plain_failure": ms}
        scram = ScramClient([mech], user, password)
        first = scram.get_client_first().encode()
        answer, first_ms = await client.call(36, 2, m.SaslAuthenticateRequest(auth_bytes=first))
        out = {"scram_first": first_ms}
        if answer.error_code == 0:
            scram.set_server_first(answer.auth_bytes.decode())
            final = scram.get_client_final().encode()
            _, out["scram_final_failure"] = await client.call(
                36, 2, m.SaslAuthenticateRequest(auth_bytes=final)
            )
        return out


def summary(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    return {"median": statistics.median(ordered), "p10": pick(0.1), "p90": pick(0.9)}


async def main(tries: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data"
        CredentialStore.in_data_dir(data).add("alice", MECH, "right")
        config = BrokerConfig(
            port=0, data_dir=data, storage="memory", listeners="SASL_PLAINTEXT://127.0.0.1:0",
            security={"sasl.enabled.mechanisms": f"PLAIN,{MECH}"},
        )  # fmt: skip
        results: dict[str, dict[str, list[float]]] = {"known": {}, "unknown": {}}
        async with trio.open_nursery() as nursery:
            broker: Broker = await nursery.start(Broker(config).run)
            port = broker.listener_bound["SASL_PLAINTEXT"][1]
            for _ in range(tries):
                for who, user in (("known", "alice"), ("unknown", "nobody")):
                    for mech in (MECH, "PLAIN"):
                        for case, ms in (await one(port, mech, user, "wrong")).items():
                            results[who].setdefault(case, []).append(ms)
            nursery.cancel_scope.cancel()
    return {who: {case: summary(v) for case, v in cases.items()} for who, cases in results.items()}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tries", type=int, default=40)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    report = trio.run(main, args.tries)
    for case in ("scram_first", "scram_final_failure", "plain_failure"):
        row = [f"{case:22}"]
        for who in ("known", "unknown"):
            s = report[who].get(case)
            row.append(f"{who}: " + ("-" if s is None else
                       f"median {s['median']:7.2f} ms (p10 {s['p10']:.2f}, p90 {s['p90']:.2f})"))  # fmt: skip
        print("  ".join(row))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
