"""The pages of `jobtui serve`: the sign-in form and the console's page, with their headers.

Every value put into a page is HTML-escaped. Nothing is loaded from anywhere but the server
itself, which the Content-Security-Policy says to the browser too: the terminal client, its
stylesheet and its font are textual-serve's files, served from the installed package.
"""

from __future__ import annotations

from html import escape

STYLE = """\
@font-face { font-family: 'Roboto Mono'; src: url('/static/fonts/RobotoMono-VariableFont_wght.ttf'); }
html, body { margin: 0; height: 100%; background: #0c181f; color: #e0e6ea;
  font-family: 'Roboto Mono', Menlo, monospace; font-size: 14px; }
body.console { display: flex; flex-direction: column; overflow: hidden; }
#bar { flex: none; display: flex; align-items: center; gap: 1em; padding: 2px 8px; background: #12232d; }
#bar .who { flex: 1; }
#bar form { margin: 0; }
button { font: inherit; color: inherit; background: #2b4656; border: 1px solid #49697c; padding: 2px 10px;
  cursor: pointer; }
button:hover { background: #3b6077; }
#terminal { flex: 1; min-height: 0; }
#closed { display: none; position: fixed; inset: 0; align-items: center; justify-content: center;
  background: rgba(12, 24, 31, 0.85); }
body.-closed #closed { display: flex; }
#closed div { background: #12232d; padding: 24px 32px; text-align: center; }
main.signin { max-width: 340px; margin: 12vh auto; padding: 24px 28px; background: #12232d; }
main.signin h1 { font-size: 20px; margin: 0 0 16px; }
main.signin label { display: block; margin: 10px 0 4px; }
main.signin input { box-sizing: border-box; width: 100%; font: inherit; padding: 6px; color: #e0e6ea;
  background: #0c181f; border: 1px solid #49697c; }
main.signin button { margin-top: 18px; width: 100%; padding: 6px; }
p.error { color: #ff8080; }
p.note, span.note { color: #9fb3bf; }
"""

# The console page's one script: the keys go to the terminal from the start, and the closed
# dialog's button opens the console again (an inline handler would need the policy to allow
# inline scripts). textual.js builds the terminal in window.onload, which runs first.
SCRIPT = """\
window.addEventListener("load", () => {
  const input = document.querySelector("#terminal .xterm-helper-textarea");
  if (input) input.focus();
  document.getElementById("again").addEventListener("click", () => window.location.reload());
});
"""


def security_headers(*, websocket_origin: str, tls: bool) -> dict[str, str]:
    """Headers of every page: nothing from elsewhere, no framing, no caching, no referrer elsewhere."""
    headers = {
        "Content-Security-Policy": (
            "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; font-src 'self';"
            f" img-src 'self' data:; connect-src 'self' {websocket_origin}; form-action 'self';"
            " frame-ancestors 'none'; base-uri 'none'"
        ),
        "X-Frame-Options": "DENY",
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "same-origin",  # no-referrer would make a form's Origin "null"
        "Cache-Control": "no-store",
        "Cross-Origin-Opener-Policy": "same-origin",
    }
    if tls:
        headers["Strict-Transport-Security"] = "max-age=31536000"
    return headers


def sign_in_page(*, error: str = "", name: str = "", note: str = "", view: str = "") -> str:
    """The sign-in form; `view` is the view a link asked for, carried to the console."""
    problem = f'<p class="error" role="alert">{escape(error)}</p>' if error else ""
    said = f'<p class="note">{escape(note)}</p>' if note else ""
    carried = f'<input type="hidden" name="open" value="{escape(view)}">' if view else ""
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>jobtui · sign in</title><link rel="stylesheet" href="/jobtui.css"></head>
<body><main class="signin"><h1>jobtui</h1>{said}{problem}
<form method="post" action="/login">{carried}
<label for="name">Name</label>
<input id="name" name="name" autocomplete="username" autocapitalize="none" spellcheck="false" required
 autofocus value="{escape(name)}">
<label for="password">Password</label>
<input id="password" name="password" type="password" autocomplete="current-password" required>
<button type="submit">Sign in</button>
</form></main></body></html>
"""


def console_page(*, user: str, role: str, websocket_url: str, font_size: int, note: str = "") -> str:
    what = "operator" if role == "operator" else "viewer: read-only console"
    said = f'<span class="note">{escape(note)}</span>' if note else ""
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>jobtui · {escape(user)}</title>
<link rel="stylesheet" href="/static/css/xterm.css"><link rel="stylesheet" href="/jobtui.css">
<script src="/static/js/textual.js"></script><script src="/jobtui.js"></script></head>
<body class="console">
<div id="bar"><span>jobtui</span>
<span class="who">signed in as <b id="user">{escape(user)}</b> · {escape(what)}</span>{said}
<form method="post" action="/logout"><button type="submit" id="signout">Sign out</button></form></div>
<div id="terminal" class="textual-terminal" data-session-websocket-url="{escape(websocket_url)}"
 data-font-size="{font_size}"></div>
<div id="closed"><div><p>The console has closed.</p><button type="button" id="again">Open it again</button></div></div>
</body></html>
"""
