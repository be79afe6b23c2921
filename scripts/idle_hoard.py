#!/usr/bin/env python3
"""The client side of scripts/idle-hoard.sh (issue #40): idle keep-alive connections that try to
hold a listener shut, and a new client beside them.

    idle_hoard.py api --target HOST:PORT --admin HOST:PORT --sources 2-50 --per-source 205 \
        [--reconnect] [--probe-seconds 30]
    idle_hoard.py admin --admin HOST:PORT [--idle 70] [--rounds 16]

`api`: from 127.0.0.<first>..<last>, `per-source` connections each send one GET and stay idle
(with --reconnect, a connection the server closes is opened again at once, as an attacker
keeping the listener full would). Then a new client on 127.0.0.60 opens a new connection for
each request, twice a second, for `probe-seconds`. Prints the hoarders' connections (opened,
answered, refused, closed by the server) and the new client's statuses, then the server's own
connection counters from the admin listener's /metrics.

`admin`: `idle` connections to the admin listener send GET /healthz and stay idle; then `rounds`
pairs of /readyz and /healthz, each on a new connection; then 64 connections whose heads trickle
in (every regular slot mid-request) and `rounds` / 2 pairs more.

Every phase is bounded in time; nothing is left open at exit.
"""
import argparse
import asyncio
import collections
import json
import re
import sys
import time
import urllib.request

ITEM = "/api/v1/items/jd/100001/rebate"
PROBE_SOURCE = "127.0.0.60"


def address(text):
    host, port = text.rsplit(":", 1)
    return host, int(port)


async def request(reader, writer, path, close=False):
    """One GET on an open connection: its status, or None if the server closed it instead."""
    head = f"GET {path} HTTP/1.1\r\nhost: hoard\r\n"
    if close:
        head += "connection: close\r\n"
    writer.write((head + "\r\n").encode())
    await writer.drain()
    status_line = await reader.readline()
    if not status_line:
        return None
    length = 0
    while True:
        line = await reader.readline()
        if not line:
            return None
        if line in (b"\r\n", b"\n"):
            break
        name, _, value = line.decode("latin-1").partition(":")
        if name.strip().lower() == "content-length":
            length = int(value.strip())
    await reader.readexactly(length)
    return int(status_line.split()[1])


async def connect(target, source):
    return await asyncio.open_connection(target[0], target[1], local_addr=(source, 0))


class Hoarder:
    """One idle connection (reopened when the server closes it, with --reconnect)."""

    def __init__(self, counts):
        self.counts = counts
        self.writer = None

    async def run(self, target, source, path, reconnect, opening, stop):
        while not stop.is_set():
            async with opening:
                try:
                    reader, self.writer = await asyncio.wait_for(connect(target, source), 10)
                except (OSError, asyncio.TimeoutError):
                    self.counts["connect_failed"] += 1
                    await asyncio.sleep(0.5)
                    continue
                self.counts["opened"] += 1
                try:
                    status = await asyncio.wait_for(request(reader, self.writer, path), 10)
                except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError):
                    status = None
            self.counts[f"status_{status}"] += 1
            # Idle: read until the server closes it, or the run ends.
            closed = asyncio.ensure_future(reader.read(1))
            stopped = asyncio.ensure_future(stop.wait())
            done, _ = await asyncio.wait({closed, stopped}, return_when=asyncio.FIRST_COMPLETED)
            for task in (closed, stopped):
                task.cancel()
            self.writer.close()
            if closed in done and not stop.is_set():
                self.counts["closed_by_server"] += 1
                if not reconnect:
                    return
            else:
                return


def metrics(admin):
    """The server's connection series from the admin listener's /metrics."""
    with urllib.request.urlopen(f"http://{admin[0]}:{admin[1]}/metrics", timeout=5) as response:
        text = response.read().decode()
    wanted = re.compile(r"^(rebate_http_(connections|idle|watchdog)[a-z_]*(\{[^}]*\})?) (\S+)$")
    return {m.group(1): float(m.group(4)) for m in map(wanted.match, text.splitlines()) if m}


async def api(args):
    target, admin = address(args.target), address(args.admin)
    first, last = (int(part) for part in args.sources.split("-"))
    counts = collections.defaultdict(int, opened=0, connect_failed=0, closed_by_server=0)
    stop = asyncio.Event()
    opening = asyncio.Semaphore(args.concurrency)
    started = time.monotonic()
    hoarders = [
        asyncio.ensure_future(
            Hoarder(counts).run(target, f"127.0.0.{source}", ITEM, args.reconnect, opening, stop)
        )
        for source in range(first, last + 1)
        for _ in range(args.per_source)
    ]
    wanted = (last - first + 1) * args.per_source
    while counts["opened"] + counts["connect_failed"] < wanted:
        if time.monotonic() - started > args.open_seconds:
            break
        await asyncio.sleep(0.2)
    await asyncio.sleep(1)
    held = dict(counts)
    held["seconds_to_open"] = round(time.monotonic() - started, 1)
    server_full = metrics(admin)
    print(json.dumps({"hoarders_after_opening": held, "server": server_full}), flush=True)

    statuses = collections.Counter()
    probe_started = time.monotonic()
    attempt = 0
    while time.monotonic() - probe_started < args.probe_seconds:
        due = probe_started + attempt * 0.5
        await asyncio.sleep(max(0.0, due - time.monotonic()))
        attempt += 1
        try:
            reader, writer = await asyncio.wait_for(connect(target, PROBE_SOURCE), 5)
            status = await asyncio.wait_for(request(reader, writer, ITEM, close=True), 5)
            writer.close()
        except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError):
            status = None
        statuses[str(status)] += 1
    stop.set()
    await asyncio.wait(hoarders, timeout=10)
    total = sum(statuses.values())
    ok = statuses.get("200", 0)
    print(
        json.dumps(
            {
                "new_client": {"requests": total, "statuses": dict(statuses),
                               "ok_share": round(ok / total, 4) if total else None},
                "hoarders_at_end": dict(counts),
                "server_at_end": metrics(admin),
            }
        ),
        flush=True,
    )
    return 0 if total and ok / total >= 0.99 else 1


async def probe_pairs(admin, rounds, statuses):
    for _ in range(rounds):
        for path in ("/readyz", "/healthz"):
            try:
                reader, writer = await asyncio.wait_for(connect(admin, PROBE_SOURCE), 5)
                status = await asyncio.wait_for(request(reader, writer, path, close=True), 5)
                writer.close()
            except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError):
                status = None
            statuses[f"{path} {status}"] += 1


async def admin(args):
    target = address(args.admin)
    idle = []
    answered = collections.Counter()
    for index in range(args.idle):
        reader, writer = await connect(target, f"127.0.0.{2 + index % 7}")
        answered[str(await request(reader, writer, "/healthz"))] += 1
        idle.append(writer)
    statuses = collections.Counter()
    await probe_pairs(target, args.rounds, statuses)
    for writer in idle:
        writer.close()
    await asyncio.sleep(0.5)
    trickling = []
    for index in range(64):
        reader, writer = await connect(target, f"127.0.0.{2 + index % 7}")
        writer.write(b"GET /healthz HTTP/1.1\r\nho")
        trickling.append(writer)
    mid_request = collections.Counter()
    await probe_pairs(target, max(1, args.rounds // 2), mid_request)
    for writer in trickling:
        writer.close()
    print(
        json.dumps(
            {
                "idle_connections": args.idle,
                "their_answers": dict(answered),
                "probes_with_idle_connections": dict(statuses),
                "probes_with_64_heads_trickling": dict(mid_request),
            }
        ),
        flush=True,
    )
    every = list(statuses.items()) + list(mid_request.items())
    return 0 if all(key.endswith(" 200") for key, _ in every) else 1


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    hoard = commands.add_parser("api")
    hoard.add_argument("--target", required=True)
    hoard.add_argument("--admin", required=True)
    hoard.add_argument("--sources", default="2-50")
    hoard.add_argument("--per-source", type=int, default=205)
    hoard.add_argument("--reconnect", action="store_true")
    hoard.add_argument("--concurrency", type=int, default=200)
    hoard.add_argument("--open-seconds", type=float, default=60)
    hoard.add_argument("--probe-seconds", type=float, default=30)
    probes = commands.add_parser("admin")
    probes.add_argument("--admin", required=True)
    probes.add_argument("--idle", type=int, default=70)
    probes.add_argument("--rounds", type=int, default=16)
    args = parser.parse_args()
    return asyncio.run(api(args) if args.command == "api" else admin(args))


if __name__ == "__main__":
    sys.exit(main())
