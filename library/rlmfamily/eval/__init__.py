"""The evaluation pack and its runner: graded tasks, paired comparisons, cost per accepted task.

``pack`` (tasks as data, validated at load), ``graders`` (acceptance from the output alone),
``conditions`` (what a condition fixes: provider, model, profile, kernel, sampling), ``scripts``
(the scripted models of offline mode), ``store`` (one record per attempt, written atomically),
``runner`` (fresh workspace per attempt, the spend cap), ``stats`` (paired differences),
``report`` (table, JSON, HTML) and ``cli`` (``rlm eval run`` / ``rlm eval report``).
"""
