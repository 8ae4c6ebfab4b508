"""Execution: how a checked request reaches a loaded version's compute.

``inputs`` checks a request against the version's metadata; the version's ``ModelExecutor``
(``executor``; built when the version loads, re-tuned when the plan in force changes) runs it on
the event loop or in the model's worker threads (``placement``), queued as ``jobs``, stacked
with others by ``batching``; ``outputs`` checks what the model returned. The DataPlane drives
it; nothing else imports it. ``load`` is the one load signal both listeners feed and the
executors read (the server wires it through ``ServerState.load``).
"""
