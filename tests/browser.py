"""A headless Chromium driven over the DevTools protocol, for the book's rendering test.

No Python dependency: Chromium is started with ``--remote-debugging-pipe`` and speaks JSON
messages, each ended by a NUL byte, on its file descriptors 3 (commands in) and 4 (replies and
events out). One browser, one tab; the test sets the viewport, opens each page and evaluates a
script in it. Chromium comes from the system (Debian: ``apt-get install chromium``); Playwright's
browser download needs the internet, which CI's machines may not have.
"""

from __future__ import annotations

import json
import os
import selectors
import shutil
import subprocess
import tempfile
import time

INSTALL_HINT = "apt-get install -y chromium"
_CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_chromium() -> str | None:
    """The Chromium executable on PATH (``$CHROMIUM`` first when set), or None."""
    for name in ((os.environ["CHROMIUM"],) if os.environ.get("CHROMIUM") else ()) + _CANDIDATES:
        found = shutil.which(name)
        if found:
            return found
    return None


class BrowserError(RuntimeError):
    pass


class Chromium:
    """``with Chromium(path) as browser:`` one headless browser with one tab."""

    def __init__(self, executable: str, timeout_s: float = 30.0):
        self.executable, self.timeout_s = executable, timeout_s
        self._next_id, self._buffer, self._events = 0, b"", []

    def __enter__(self) -> "Chromium":
        self._profile = tempfile.TemporaryDirectory(prefix="chromium-")
        to_child, self._cmd_w = os.pipe()
        self._out_r, from_child = os.pipe()

        def wire_fds():  # in the child, before exec: the pipe ends become its fds 3 and 4
            os.dup2(to_child, 3)
            os.dup2(from_child, 4)

        args = [self.executable, "--headless=new", "--remote-debugging-pipe", "--disable-gpu",
                "--no-first-run", "--no-default-browser-check", "--disable-extensions",
                "--hide-scrollbars", "--mute-audio", f"--user-data-dir={self._profile.name}",
                "about:blank"]
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            args.insert(1, "--no-sandbox")  # Chromium refuses to run as root with its sandbox
        self._proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL, preexec_fn=wire_fds,
                                      pass_fds=(3, 4))
        os.close(to_child)
        os.close(from_child)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._out_r, selectors.EVENT_READ)
        target = self.send("Target.createTarget", url="about:blank")["targetId"]
        self._session = self.send("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        self.send("Page.enable", session=True)
        return self

    def __exit__(self, *exc) -> None:
        try:
            self.send("Browser.close")
        except (BrowserError, OSError):
            pass
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._selector.close()
        for fd in (self._cmd_w, self._out_r):
            os.close(fd)
        self._profile.cleanup()

    # -- protocol --------------------------------------------------------------------------

    def _read_message(self, deadline: float) -> dict:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not self._selector.select(left):
                raise BrowserError(f"Chromium did not answer within {self.timeout_s:.0f} s")
            chunk = os.read(self._out_r, 1 << 20)
            if not chunk:
                raise BrowserError(f"Chromium exited (code {self._proc.poll()})")
            self._buffer += chunk
        raw, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(raw)

    def send(self, method: str, session: bool = False, **params) -> dict:
        """Send one command and return its result (events that arrive meanwhile are kept)."""
        self._next_id += 1
        message = {"id": self._next_id, "method": method, "params": params}
        if session:
            message["sessionId"] = self._session
        os.write(self._cmd_w, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + self.timeout_s
        while True:
            reply = self._read_message(deadline)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise BrowserError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            if "method" in reply:
                self._events.append(reply)

    def wait_event(self, method: str) -> dict:
        deadline = time.monotonic() + self.timeout_s
        while True:
            for i, event in enumerate(self._events):
                if event["method"] == method:
                    return self._events.pop(i)["params"]
            self._events.append(self._read_message(deadline))

    # -- what the test uses ----------------------------------------------------------------

    def set_viewport(self, width: int, height: int, mobile: bool) -> None:
        self.send("Emulation.setDeviceMetricsOverride", session=True, width=width, height=height,
                  deviceScaleFactor=1, mobile=mobile)

    def open(self, url: str) -> None:
        """Navigate and wait for the load event (scripts, styles and images loaded)."""
        self._events.clear()
        result = self.send("Page.navigate", session=True, url=url)
        if result.get("errorText"):
            raise BrowserError(f"{url}: {result['errorText']}")
        self.wait_event("Page.loadEventFired")

    def watch_network(self) -> None:
        """Record every request the tab makes from now on (see :meth:`requested_urls`)."""
        self.send("Network.enable", session=True)

    def requested_urls(self) -> list[str]:
        """The URLs requested since the last :meth:`open` (needs :meth:`watch_network`)."""
        return [e["params"]["request"]["url"] for e in self._events
                if e["method"] == "Network.requestWillBeSent"]

    def evaluate(self, expression: str):
        """The value of a JavaScript expression in the page (a promise is awaited)."""
        result = self.send("Runtime.evaluate", session=True, expression=expression,
                           awaitPromise=True, returnByValue=True)
        if "exceptionDetails" in result:
            raise BrowserError(f"script failed: {result['exceptionDetails']}")
        return result["result"].get("value")
