"""Dispatch: getting an admitted job to a worker (one interface, Cloud Tasks or embedded)."""

from workers.dispatch.base import DispatchError, DispatchJob, Dispatcher, EnqueueResult, task_id_for

__all__ = ["DispatchError", "DispatchJob", "Dispatcher", "EnqueueResult", "task_id_for"]
