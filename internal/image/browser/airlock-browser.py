#!/usr/bin/python3
"""airlock-browser: Chromium for airlock, in the browser image.

    airlock-browser start [--view|--interactive]
                                           start what is not running (the screen,
                                           Chromium, the CDP relay, the live view);
                                           print the status when Chromium answers
                                           (and the view, with --view; the view with
                                           keyboard and mouse too, with --interactive)
    airlock-browser status                 print the status; exit 3 if Chromium is down
    airlock-browser stop                   stop all of it
    airlock-browser trust                  trust the egress proxy's CA in Chromium

The status is one JSON line: {"running", "cdp_port", "view_port",
"interactive_port", "browser", "protocol", "sandbox", "pid"}.

Run as root (the host runs it through an exec); everything it starts runs
as the user "browser". Chromium listens on 127.0.0.1:9223 only; a relay
(socat) serves it on port 9222 of the guest's IPv4 addresses so that the
host can reach it through the sandbox's network. The view: x11vnc on
loopback (5900 view-only, 5901 interactive) behind websockify with noVNC
(6080, 6081). Under QEMU without KVM every start is slow, so the script
imports little and waits long.
"""

import fcntl
import json
import os
import pwd
import signal
import socket
import subprocess
import sys
import time

RUN = "/run/airlock-browser"
USER = "browser"
DISPLAY = ":99"
SCREEN = "1280x800x24"
CDP_INTERNAL = 9223
CDP_PORT = 9222
VNC_VIEW, VNC_INTERACTIVE = 5900, 5901
VIEW_PORT, INTERACTIVE_PORT = 6080, 6081
CA_FILE = "/usr/local/share/ca-certificates/airlock-egress.crt"
START_TIMEOUT = float(os.environ.get("AIRLOCK_BROWSER_TIMEOUT", "240"))

CHROMIUM_FLAGS = [
    "--remote-debugging-address=127.0.0.1",
    "--remote-debugging-port=%d" % CDP_INTERNAL,
    "--user-data-dir=/home/browser/.config/chromium",
    "--no-first-run",
    "--no-default-browser-check",
    "--password-store=basic",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-breakpad",
    "--disable-dev-shm-usage",
    "--disable-gpu",
    "--disable-features=Translate,MediaRouter,OptimizationHints,DialMediaRouteProvider",
    "--metrics-recording-only",
    "--window-position=0,0",
    "--window-size=1280,800",
    "--test-type",  # no "unsupported command-line flag" infobar
    "about:blank",
]


def log(msg):
    print("airlock-browser: " + msg, file=sys.stderr, flush=True)


def user():
    return pwd.getpwnam(USER)


def pidfile(name):
    return os.path.join(RUN, name + ".pid")


def alive(name):
    """The pid of a started process that still runs, or 0."""
    try:
        with open(pidfile(name)) as f:
            pid = int(f.read().strip())
        with open("/proc/%d/stat" % pid) as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        return 0 if state == "Z" else pid
    except (OSError, ValueError, IndexError):
        return 0


def spawn(name, argv, env=None):
    """Start argv as the browser user in a session of its own; its output
    goes to RUN/name.log. Returns the Popen."""
    pw = user()
    e = {
        "HOME": pw.pw_dir, "USER": USER, "LOGNAME": USER, "SHELL": "/bin/bash",
        "PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "DISPLAY": DISPLAY,
        "XDG_RUNTIME_DIR": os.path.join(RUN, "xdg"),
    }
    e.update(env or {})
    out = open(os.path.join(RUN, name + ".log"), "ab")
    p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=e,
                         cwd=pw.pw_dir, user=pw.pw_uid, group=pw.pw_gid, extra_groups=[],
                         start_new_session=True, close_fds=True)
    out.close()
    with open(pidfile(name), "w") as f:
        f.write(str(p.pid))
    return p


def wait_for(check, timeout, what, proc=None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        if proc is not None and proc.poll() is not None:
            return False
        time.sleep(0.05)
    raise SystemExit("airlock-browser: %s did not start in %ds" % (what, timeout))


def port_open(port):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            return True
    except OSError:
        return False


def cdp_version():
    """Chromium's /json/version, or None. A plain HTTP/1.1 GET (urllib
    costs seconds to import under TCG; Chromium refuses HTTP/1.0), read
    until the Content-Length (Chromium may keep the connection open)."""
    try:
        with socket.create_connection(("127.0.0.1", CDP_INTERNAL), timeout=15) as s:
            s.sendall(b"GET /json/version HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            data, want = b"", None
            while len(data) < 1 << 20:
                if want is None and b"\r\n\r\n" in data:
                    head = data.split(b"\r\n\r\n", 1)[0]
                    want = len(head) + 4 + int(dict(
                        (k.strip().lower(), v.strip()) for k, _, v in
                        (line.partition(b":") for line in head.split(b"\r\n")[1:])).get(b"content-length", b"-1"))
                if want is not None and want >= 0 and len(data) >= want:
                    break
                b = s.recv(65536)
                if not b:
                    break
                data += b
        head, _, body = data.partition(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 200"):
            return None
        return json.loads(body)
    except (OSError, ValueError):
        return None


def tail(name, n=2000):
    try:
        with open(os.path.join(RUN, name + ".log"), "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - n))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def start_screen():
    if alive("xvfb") and os.path.exists("/tmp/.X11-unix/X99"):
        return
    os.makedirs("/tmp/.X11-unix", exist_ok=True)
    os.chmod("/tmp/.X11-unix", 0o1777)
    p = spawn("xvfb", ["Xvfb", DISPLAY, "-screen", "0", SCREEN, "-nolisten", "tcp", "-ac"])
    if not wait_for(lambda: os.path.exists("/tmp/.X11-unix/X99"), START_TIMEOUT, "the screen (Xvfb)", p):
        raise SystemExit("airlock-browser: Xvfb exited: " + tail("xvfb"))


def trust_ca():
    """Add the egress proxy's CA (present when the sandbox has secrets) to
    the browser user's NSS database, which Chromium reads."""
    if not os.path.exists(CA_FILE):
        return False
    pw = user()
    db = os.path.join(pw.pw_dir, ".pki", "nssdb")
    env = {"HOME": pw.pw_dir, "PATH": "/usr/bin:/bin"}

    def run(argv):
        subprocess.run(argv, check=True, env=env, user=pw.pw_uid, group=pw.pw_gid, extra_groups=[],
                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    if not os.path.exists(os.path.join(db, "cert9.db")):
        run(["mkdir", "-p", "-m", "0700", db])
        run(["certutil", "-N", "-d", "sql:" + db, "--empty-password"])
    run(["certutil", "-A", "-d", "sql:" + db, "-n", "airlock-egress", "-t", "C,,", "-i", CA_FILE])
    return True


def sandbox_state():
    try:
        with open(os.path.join(RUN, "sandbox")) as f:
            return f.read().strip() == "on"
    except OSError:
        return True


def start_chromium():
    """Start Chromium unless it answers; returns its /json/version."""
    v = cdp_version() if alive("chromium") else None
    if v:
        return v
    trust_ca()
    for sandboxed in (True, False):
        flags = list(CHROMIUM_FLAGS)
        if not sandboxed:
            flags.insert(0, "--no-sandbox")
        p = spawn("chromium", ["/usr/bin/chromium"] + flags, {"CHROMIUM_FLAGS": ""})
        got = {}

        def answers():
            got["v"] = cdp_version()
            return got["v"] is not None

        if wait_for(answers, START_TIMEOUT, "Chromium", p):
            with open(os.path.join(RUN, "sandbox"), "w") as f:
                f.write("on" if sandboxed else "off")
            return got["v"]
        if sandboxed:
            log("Chromium exited with its sandbox on (this kernel does not allow it?); "
                "starting it without: " + tail("chromium", 600))
    raise SystemExit("airlock-browser: Chromium exited: " + tail("chromium"))


def start_relay():
    if alive("relay") and port_open(CDP_PORT):
        return
    p = spawn("relay", ["socat", "TCP4-LISTEN:%d,fork,reuseaddr" % CDP_PORT, "TCP4:127.0.0.1:%d" % CDP_INTERNAL])
    if not wait_for(lambda: port_open(CDP_PORT), START_TIMEOUT, "the CDP relay", p):
        raise SystemExit("airlock-browser: the relay exited: " + tail("relay"))


def start_view(interactive, wait):
    """Start the live view (x11vnc and websockify with noVNC); wait for it
    only if wait (Chromium's DevTools do not wait for the view)."""
    vnc, web, name = (VNC_INTERACTIVE, INTERACTIVE_PORT, "-interactive") if interactive else (VNC_VIEW, VIEW_PORT, "")
    if not (alive("x11vnc" + name) and port_open(vnc)):
        argv = ["x11vnc", "-display", DISPLAY, "-rfbport", str(vnc), "-localhost", "-shared", "-forever",
                "-nopw", "-quiet", "-noxdamage"]
        if not interactive:
            argv.append("-viewonly")
        p = spawn("x11vnc" + name, argv)
        if wait and not wait_for(lambda: port_open(vnc), START_TIMEOUT, "x11vnc", p):
            raise SystemExit("airlock-browser: x11vnc exited: " + tail("x11vnc" + name))
    if not (alive("websockify" + name) and port_open(web)):
        p = spawn("websockify" + name, ["websockify", "--web", "/usr/share/novnc", "0.0.0.0:%d" % web, "127.0.0.1:%d" % vnc])
        if wait and not wait_for(lambda: port_open(web), START_TIMEOUT, "websockify", p):
            raise SystemExit("airlock-browser: websockify exited: " + tail("websockify" + name))


def status(v=None):
    """The status; v is Chromium's /json/version if the caller has it (a
    busy Chromium under TCG can take long to answer again)."""
    if v is None:
        v = cdp_version()
    running = v is not None and alive("chromium") != 0
    return {
        "running": running,
        "cdp_port": CDP_PORT if running and port_open(CDP_PORT) else 0,
        "view_port": VIEW_PORT if port_open(VIEW_PORT) else 0,
        "interactive_port": INTERACTIVE_PORT if port_open(INTERACTIVE_PORT) else 0,
        "browser": (v or {}).get("Browser", ""),
        "protocol": (v or {}).get("Protocol-Version", ""),
        "sandbox": sandbox_state() if running else False,
        "pid": alive("chromium"),
    }


def stop():
    for name in ("websockify-interactive", "x11vnc-interactive", "websockify", "x11vnc", "relay", "chromium", "xvfb"):
        pid = alive(name)
        if pid:
            try:
                os.killpg(pid, signal.SIGTERM)
            except OSError:
                pass
        try:
            os.remove(pidfile(name))
        except OSError:
            pass


def main():
    args = sys.argv[1:]
    cmd = args[0] if args else "status"
    if os.geteuid() != 0:
        raise SystemExit("airlock-browser: run me as root (I start the browser as the user %r)" % USER)
    os.makedirs(RUN, mode=0o755, exist_ok=True)
    pw = user()
    xdg = os.path.join(RUN, "xdg")
    os.makedirs(xdg, mode=0o700, exist_ok=True)
    os.chown(xdg, pw.pw_uid, pw.pw_gid)
    with open(os.path.join(RUN, "lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if cmd == "start":
            start_screen()
            v = start_chromium()
            start_relay()
            interactive = "--interactive" in args
            start_view(False, interactive or "--view" in args)
            if interactive:
                start_view(True, True)
            print(json.dumps(status(v)), flush=True)
        elif cmd == "status":
            st = status()
            print(json.dumps(st), flush=True)
            if not st["running"]:
                sys.exit(3)
        elif cmd == "stop":
            stop()
        elif cmd == "trust":
            print("trusted" if trust_ca() else "no CA to trust", flush=True)
        else:
            raise SystemExit(__doc__)


if __name__ == "__main__":
    main()
