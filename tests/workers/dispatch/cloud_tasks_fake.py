"""A stand-in for Google's hosted Cloud Tasks API on 127.0.0.1, speaking the real gRPC wire format.

Only for what the emulator does not do (it ignores OIDC and delivers duplicate
names twice): this server remembers task names like the real service and answers
ALREADY_EXISTS, and can lose its first answer to test the client's retry.
"""

from __future__ import annotations

import threading
from concurrent import futures

import grpc
from google.cloud import tasks_v2


class FakeCloudTasks:
    def __init__(self, *, lose_first_answers: int = 0) -> None:
        self.requests: list[tasks_v2.CreateTaskRequest] = []
        self.names: set[str] = set()
        self.lose_first_answers = lose_first_answers
        self._lock = threading.Lock()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        handler = grpc.method_handlers_generic_handler(
            "google.cloud.tasks.v2.CloudTasks",
            {
                "CreateTask": grpc.unary_unary_rpc_method_handler(
                    self._create_task,
                    request_deserializer=tasks_v2.CreateTaskRequest.deserialize,
                    response_serializer=tasks_v2.Task.serialize,
                )
            },
        )
        self.server.add_generic_rpc_handlers((handler,))
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.host = f"127.0.0.1:{self.port}"

    def _create_task(self, request: tasks_v2.CreateTaskRequest, context: grpc.ServicerContext) -> tasks_v2.Task:
        with self._lock:
            self.requests.append(request)
            name = request.task.name
            if name in self.names:
                context.abort(grpc.StatusCode.ALREADY_EXISTS, f"Requested entity already exists: {name}")
            self.names.add(name)
            if self.lose_first_answers > 0:
                self.lose_first_answers -= 1  # created, but the caller never hears so
                context.abort(grpc.StatusCode.UNAVAILABLE, "connection reset")
        return request.task

    def __enter__(self) -> "FakeCloudTasks":
        self.server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.stop(grace=0)
