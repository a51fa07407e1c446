"""Run the Cloud Tasks emulator bound to 127.0.0.1 on a free port (runs in .venv-emulator, not the service).

The emulator's own command binds every interface on a fixed port; this launcher
binds loopback only, on a port the kernel picks, prints ``READY <port>`` once the
gRPC server accepts calls, and exits when its parent dies or on SIGTERM.
Usage: python _emulator_launcher.py MAX_RETRIES QUEUE [QUEUE ...]
"""

import logging
import os
import signal
import sys
import time
from concurrent import futures

import grpc
from gcloud_tasks_emulator import server as emu
from gcloud_tasks_emulator.cloudtasks_pb2_grpc import add_CloudTasksServicer_to_server
from google.cloud.tasks_v2 import Queue


def main() -> int:
    max_retries = int(sys.argv[1])
    queue_names = sys.argv[2:]
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    parent = os.getppid()

    state = emu.QueueState("127.0.0.1", 80, max_retries)
    for name in queue_names:
        state.create_queue(name.rsplit("/", 2)[0], Queue(name=name))
    grpc_server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    add_CloudTasksServicer_to_server(emu.Greeter(state), grpc_server)
    port = grpc_server.add_insecure_port("127.0.0.1:0")
    grpc_server.start()
    processor = emu.Processor(state)
    processor.daemon = True
    processor.start()

    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    print(f"READY {port}", flush=True)
    while not stopping and os.getppid() == parent:
        time.sleep(0.1)
    processor._is_running.clear()
    grpc_server.stop(grace=0)
    os._exit(0)  # the processor's queue threads are not daemons; do not wait for a delivery in flight


if __name__ == "__main__":
    sys.exit(main())
