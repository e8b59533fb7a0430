"""Running untrusted Python (model-written code, task checkers) in a bubblewrap sandbox.

``runner`` decides how code is isolated, ``seccomp`` builds the syscall
filter, ``pipes`` captures its output, ``cli`` is ``unimas sandbox FILE``.
It knows nothing of training: workflows and plugins call it.

May import: errors, safe_load.
"""
