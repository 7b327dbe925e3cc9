"""The results page in headless Chromium: what a reader's browser makes of it at a given width.

:func:`measure` loads a copy of the page with a probe script appended and returns the DOM after the page's
own script ran, the console lines Chromium logged, and the probe's layout numbers: the page's scroll width
against the window's inner width (a page-wide sideways scroll when larger), and where the leaderboard's
first score cell and its first published score lie (on screen, and inside their scroll box). :func:`screenshot` writes a PNG of the
top of the page. Chromium is the Debian package ``chromium`` (``.ci/run`` installs it); without it
:func:`chromium` returns None and the callers say so.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

PROBE = """<script>(function(){
  var d=document.documentElement;
  var out={scrollWidth:d.scrollWidth, innerWidth:window.innerWidth, ready:document.body.getAttribute('data-ready')};
  function where(s){
    if(!s) return null;
    var r=s.getBoundingClientRect(), box=s.closest('.scroll'), b=box?box.getBoundingClientRect():r;
    return {left:r.left, right:r.right, top:r.top, boxLeft:b.left, boxRight:b.right, text:s.textContent};
  }
  out.score=where(document.querySelector('td.S-here'));
  out.published_score=where(document.querySelector('#leaderboard-table td.pub'));
  document.body.setAttribute('data-probe', JSON.stringify(out));
})();</script>"""
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome")


class BrowserError(RuntimeError):
    """Chromium did not render the page (one line, with the end of its output)."""


@dataclass
class Rendered:
    dom: str
    console: list[str]  # console messages and uncaught errors Chromium logged
    probe: dict


def chromium() -> str | None:
    for name in CHROMIUM_NAMES:
        p = shutil.which(name)
        if p:
            return p
    return None


def _run(args: list[str], profile: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    exe = chromium()
    if exe is None:
        raise BrowserError("chromium not installed (Debian package `chromium`: apt-get install -y chromium)")
    base = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
            f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0"]
    env = {**os.environ, "DBUS_SESSION_BUS_ADDRESS": "disabled:"}
    r = subprocess.run(base + args, capture_output=True, text=True, timeout=timeout, env=env)
    if r.returncode != 0:
        raise BrowserError(f"chromium exited {r.returncode}: {' '.join(r.stderr[-600:].split())}")
    return r


def measure(page: str | Path, width: int, height: int = 1200) -> Rendered:
    """The page at ``width`` x ``height`` CSS pixels: DOM, console lines, probe numbers."""
    page = Path(page)
    with tempfile.TemporaryDirectory(prefix="sab-page-") as tmp:
        probe_page = Path(tmp) / "probe.html"
        html = page.read_text(encoding="utf-8")
        probe_page.write_text(html.replace("</body>", PROBE + "</body>", 1), encoding="utf-8")
        r = _run([f"--window-size={width},{height}", "--dump-dom", probe_page.resolve().as_uri()],
                 Path(tmp) / "profile")
    console = [ln for ln in r.stderr.splitlines() if ":CONSOLE" in ln or "Uncaught" in ln]
    m = re.search(r'data-probe="([^"]*)"', r.stdout)
    if not m:
        raise BrowserError(f"{page}: the probe did not run (no data-probe in the DOM); console: {console[:3]}")
    from html import unescape

    return Rendered(dom=r.stdout, console=console, probe=json.loads(unescape(m.group(1))))


def screenshot(page: str | Path, out: str | Path, width: int, height: int) -> Path:
    """A PNG of the top ``height`` pixels of the page at ``width``."""
    out = Path(out)
    with tempfile.TemporaryDirectory(prefix="sab-shot-") as tmp:
        _run([f"--window-size={width},{height}", f"--screenshot={out.resolve()}", Path(page).resolve().as_uri()],
             Path(tmp) / "profile")
    if not out.is_file() or out.read_bytes()[:8] != b"\x89PNG\r\n\x1a\n":
        raise BrowserError(f"{out}: chromium wrote no PNG")
    return out


__all__ = ["BrowserError", "Rendered", "chromium", "measure", "screenshot", "PROBE"]
