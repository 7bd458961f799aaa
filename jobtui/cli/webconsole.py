"""A web console's process: `python -m jobtui.cli.webconsole [jobtui options]`.

It runs the console of `jobtui` as the command line would (the same app, its panes, keys and
read-only mode), on the web driver that `jobtui serve` sets in TEXTUAL_DRIVER, and ends when
the server that started it is gone (a server killed outright cannot ask it to quit).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

PARENT_CHECK = 1.0  # seconds between looks at the parent
TERM_GRACE = 5.0  # seconds the console gets to quit on SIGTERM before the process exits anyway


def watch_parent(parent: int) -> None:
    """End this process once its parent has gone (it is then re-parented)."""
    while os.getppid() == parent:
        time.sleep(PARENT_CHECK)
    os.kill(os.getpid(), signal.SIGTERM)  # the web driver turns it into the app's exit
    time.sleep(TERM_GRACE)
    os._exit(1)


def main() -> int:
    threading.Thread(target=watch_parent, args=(os.getppid(),), name="parent-watch", daemon=True).start()
    from jobtui.cli.main import main as jobtui_main

    return jobtui_main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
