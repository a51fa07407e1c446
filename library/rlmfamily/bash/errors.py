"""Errors of command jobs: each a stable code and a message that says what to do."""

from __future__ import annotations

from rlmfamily.errors import RLMError


class JobError(RLMError):
    code = "job_error"


class BashUnavailable(JobError):
    """No Bash, or no POSIX process groups: the profile refuses rather than use another shell."""

    code = "bash_unavailable"


class JobNotFound(JobError):
    code = "job_not_found"


class JobRequestConflict(JobError):
    """The same request id was used before for another command."""

    code = "job_request_conflict"


class WorkspaceLeaseHeld(JobError):
    """An interrupted job holds the workspace: its effects are unverified until someone releases it."""

    code = "workspace_lease_held"


class WorkspaceBusy(JobError):
    """The lease (or a read-only slot) stayed taken for ``bash_lease_wait_s``."""

    code = "workspace_busy"


class JobRefused(JobError):
    """A command, working directory or deadline outside what the settings allow."""

    code = "job_refused"


class JobLimitReached(JobError):
    code = "job_limit_reached"


class ReleaseRefused(JobError):
    code = "release_refused"
