"""Backlog drains against slow destinations (run by scripts/bench-slow-destination).

Each drain gets a fresh database, a fresh SQS server (moto slows with what it holds, so no drain
inherits another's messages) and a fresh queue. One line per drain, then a Markdown table.
"""

import asyncio
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

import boto3

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RELAY = os.environ.get("OUTBOX_SLOW_RELAY", os.path.join(ROOT, "target/release/outbox-relay"))
ROWS = int(os.environ.get("OUTBOX_SLOW_ROWS", "1000"))
ROUNDS = int(os.environ.get("OUTBOX_SLOW_ROUNDS", "2"))
MODES = os.environ.get("OUTBOX_SLOW_MODES", "fixed adaptive").split()
TIMEOUT = float(os.environ.get("OUTBOX_SLOW_TIMEOUT", "900"))
DESTINATION = os.environ.get("OUTBOX_SLOW_DESTINATION", "moto")
EXTRA = os.environ.get("OUTBOX_SLOW_RELAY_ARGS", "").split()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pg_bin(name):
    bindir = os.environ.get("OUTBOX_TEST_PG_BINDIR")
    path = os.path.join(bindir, name) if bindir else shutil.which(name)
    # initdb and postgres refuse to run as root.
    return ["runuser", "-u", "postgres", "--", path] if os.geteuid() == 0 else [path]


class Postgres:
    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="outbox-slow-pg-")
        if os.geteuid() == 0:
            shutil.chown(self.dir, "postgres", "postgres")
        self.port = free_port()
        data = os.path.join(self.dir, "data")
        subprocess.run(pg_bin("initdb") + ["-D", data, "-U", "postgres", "-A", "trust"],
                       check=True, stdout=subprocess.DEVNULL)
        subprocess.run(pg_bin("pg_ctl") + ["-D", data, "-l", os.path.join(self.dir, "log"), "-w",
                        "-o", f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 "
                              "-c fsync=off -c synchronous_commit=off", "start"],
                       check=True, stdout=subprocess.DEVNULL)
        self.data = data

    def url(self, db):
        return f"postgres://postgres@127.0.0.1:{self.port}/{db}"

    def sql(self, db, statement):
        out = subprocess.run(["psql", "-qAtX", "-v", "ON_ERROR_STOP=1", self.url(db), "-c", statement],
                             check=True, capture_output=True, text=True)
        return out.stdout.strip()

    def stop(self):
        subprocess.run(pg_bin("pg_ctl") + ["-D", self.data, "-m", "immediate", "stop"],
                       stdout=subprocess.DEVNULL)
        shutil.rmtree(self.dir, ignore_errors=True)


def start_server(kind):
    if kind == "moto":
        cmd = [os.path.join(ROOT, ".tools/venv/bin/python"),
               os.path.join(ROOT, "tests/sqs-servers/moto_server.py")]
    else:
        cmd = ["node", os.path.join(ROOT, "tests/sqs-servers/fauxqs.mjs"),
               os.path.join(ROOT, ".tools/node_modules/fauxqs/dist/app.js")]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    for line in proc.stdout:
        if line.startswith("LISTENING "):
            endpoint = line.split()[1].strip()
            threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()
            return proc, endpoint
    raise RuntimeError(f"{kind} did not start")


class Proxy:
    """HTTP/1.1 in front of the SQS server: `delay` adds a fixed time to every request,
    `serial` answers one request at a time after that time (a server with one worker)."""

    def __init__(self, upstream, mode, delay):
        self.upstream = upstream.replace("http://", "").rstrip("/").split(":")
        self.mode, self.delay = mode, delay
        self.port = free_port()
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()
        threading.Thread(target=self._run, args=(ready,), daemon=True).start()
        ready.wait()

    def _run(self, ready):
        asyncio.set_event_loop(self.loop)
        self.lock = asyncio.Lock()
        server = self.loop.run_until_complete(
            asyncio.start_server(self._serve, "127.0.0.1", self.port))
        ready.set()
        self.loop.run_until_complete(server.serve_forever())

    async def _serve(self, reader, writer):
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(re.search(rb"(?i)content-length:\s*(\d+)", head).group(1)) \
                    if re.search(rb"(?i)content-length:", head) else 0
                body = await reader.readexactly(length)
                if self.mode == "serial":
                    async with self.lock:
                        await asyncio.sleep(self.delay)
                        response = await self._forward(head, body)
                else:
                    await asyncio.sleep(self.delay)
                    response = await self._forward(head, body)
                writer.write(response)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def _forward(self, head, body):
        r, w = await asyncio.open_connection(self.upstream[0], int(self.upstream[1]))
        lines = [l for l in head.split(b"\r\n") if l and not l.lower().startswith(b"connection:")]
        w.write(b"\r\n".join(lines) + b"\r\nConnection: close\r\n\r\n" + body)
        await w.drain()
        response = await r.read()
        w.close()
        # Keep the client's connection: the upstream's framing is its Content-Length.
        head_end = response.index(b"\r\n\r\n")
        lines = [l for l in response[:head_end].split(b"\r\n")
                 if not l.lower().startswith(b"connection:")]
        return b"\r\n".join(lines) + b"\r\n\r\n" + response[head_end + 4:]

    @property
    def endpoint(self):
        return f"http://127.0.0.1:{self.port}"


def metric(text, series):
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    return None


def drain(pg, n, mode, round_no):
    db = f"slow_{mode}_{round_no}_{n}"
    pg.sql("postgres", f"CREATE DATABASE {db}")
    subprocess.run([RELAY, "migrate", "--database-url", pg.url(db)], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    pg.sql(db, "INSERT INTO outbox (event_id, aggregate_type, aggregate_id, event_type, payload) "
               f"SELECT 'e-' || g, 'order', (g % 50)::text, 'order.paid', "
               "jsonb_build_object('order_id', g, 'note', repeat('x', 250)) "
               f"FROM generate_series(1, {n}) g")
    kind = "moto" if DESTINATION == "moto" else "fauxqs"
    server, endpoint = start_server(kind)
    proxy = None
    if DESTINATION != "moto":
        how, ms = DESTINATION.split(":")
        proxy = Proxy(endpoint, how, float(ms.rstrip("ms")) / 1000)
    sqs = boto3.client("sqs", endpoint_url=endpoint, region_name="us-east-1",
                       aws_access_key_id="test", aws_secret_access_key="test")
    queue = sqs.create_queue(QueueName=db)["QueueUrl"]
    metrics_port = free_port()
    env = dict(os.environ, AWS_ACCESS_KEY_ID="test", AWS_SECRET_ACCESS_KEY="test",
               AWS_REGION="us-east-1", RUST_LOG="warn")
    log = open(os.path.join(tempfile.gettempdir(), f"outbox-slow-{db}.log"), "w")
    relay = subprocess.Popen(
        [RELAY, "run", "--database-url", pg.url(db), "--queue-url", queue,
         "--sqs-endpoint-url", proxy.endpoint if proxy else endpoint,
         "--metrics-addr", f"127.0.0.1:{metrics_port}", "--retention", "1h",
         "--request-concurrency", mode] + EXTRA,
        env=env, stdout=log, stderr=subprocess.STDOUT)
    started = time.monotonic()
    sent = 0
    while time.monotonic() - started < TIMEOUT:
        sent = int(pg.sql(db, "SELECT count(*) FROM outbox WHERE sent_at IS NOT NULL"))
        if sent == n:
            break
        time.sleep(0.1)
    took = time.monotonic() - started
    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics").read().decode()
    relay.terminate()
    relay.wait()
    # A drain cut off by the timeout had requests in flight: SIGTERM lets the relay record them.
    sent_after = int(pg.sql(db, "SELECT count(*) FROM outbox WHERE sent_at IS NOT NULL"))
    attrs = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=[
        "ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"])["Attributes"]
    on_queue = sum(int(v) for v in attrs.values())
    server.kill()
    server.wait()
    result = {
        "mode": mode, "rows": n, "sent": sent, "seconds": took,
        "transient": metric(text, 'outbox_send_failures_total{kind="transient"}'),
        "throttled": metric(text, 'outbox_send_failures_total{kind="throttled"}'),
        "copies": on_queue - sent_after,
        "limit": metric(text, f'outbox_request_concurrency_limit{{destination="{queue}"}}'),
    }
    print(" ".join(f"{k}={v}" for k, v in result.items()), flush=True)
    return result


def main():
    pg = Postgres()
    results = []
    try:
        for round_no in range(ROUNDS):
            for mode in MODES:
                results.append(drain(pg, ROWS, mode, round_no))
    finally:
        pg.stop()
    print(f"\n{DESTINATION}, {ROWS} rows; relay flags: --request-concurrency MODE {' '.join(EXTRA)}")
    print("| mode | delivered | time (s) | rows/s | transient failures (entries) | copies | limit at the end |")
    print("|---|---|---|---|---|---|---|")
    for r in results:
        rate = r["sent"] / r["seconds"] if r["seconds"] else 0
        print(f"| {r['mode']} | {r['sent']}/{r['rows']} | {r['seconds']:.1f} | {rate:.0f} | "
              f"{r['transient']:.0f} | {r['copies']} | {r['limit']:.0f} |")


if __name__ == "__main__":
    sys.exit(main())
