"""The Python+Bash profile (``RLM_PROFILE=python-bash``): command jobs run by one broker.

- ``host.py``: finding Bash, refusing without POSIX process groups, the allow-listed environment;
- ``store.py``: the durable jobs and the workspace lease (``jobs.sqlite3``);
- ``broker.py``: one command broker, behind ``bash.run(...)`` and the ``bash`` tool alike;
- ``extension.py``: the session extension that puts both in a run;
- ``cli.py``: ``rlm jobs`` and ``rlm jobs release``.
"""
