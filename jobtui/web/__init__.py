"""`jobtui serve`: the console in a browser, behind a sign-in.

The server (`server.py`, aiohttp) signs users in (`users.py`, `sessions.py`) and, for each
browser tab, starts one console process (`bridge.py`, `child.py`): the very console of
`jobtui`, run on Textual's web driver, whose screen goes to the tab over a WebSocket and whose
keys come back from it. The browser side is textual-serve's terminal client (xterm.js), served
from the installed package. The server itself never loads Textual.
"""
