"""Imported first by the check's fork server: it ignores Ctrl-C from here on.

A terminal's Ctrl-C reaches every process of the group. The fork server spends seconds importing torch; a
Ctrl-C then would print its traceback beside the parent's one line. The parent hears Ctrl-C and ends the fork
server and the workers itself (``runner._stop_forkserver``), so the fork server has no use for it.
"""

import signal

signal.signal(signal.SIGINT, signal.SIG_IGN)
