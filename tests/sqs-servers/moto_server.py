"""Starts moto's SQS-compatible server for the integration tests on 127.0.0.1 only.

The OS picks the port (port 0) so parallel test runs never race for one; the harness reads the
`LISTENING` line to learn it. Run with the interpreter of .tools/venv, which has moto[server].
"""

import sys
import threading

from moto.moto_server.threaded_moto_server import ThreadedMotoServer


def main() -> None:
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    print(f"LISTENING http://{host}:{port}", flush=True)
    # The server runs in a daemon thread; the harness ends this process with a signal.
    threading.Event().wait()


if __name__ == "__main__":
    sys.exit(main())
