"""A real nginx serving a folder over loopback, with a bandwidth cap: the "remote" upstream.

    with NginxServer("shards/", rate_limit_bytes_per_s=2_000_000) as server:
        dataset = ShardDataset(server.url)
    NginxServer(proxy="http://127.0.0.1:9000", ...)   # or in front of a server (see *Proxy*)

Everything nginx writes (config, pid, logs, temp files) lives in a fresh temp folder,
``dataecho-nginx-*`` in the temp directory. nginx runs in the foreground (``daemon off``) in its
own process group, and is stopped (SIGTERM, then SIGKILL for the whole group) and its folder
removed on ``__exit__``, on an error while starting, on Ctrl-C (the ``KeyboardInterrupt`` runs
``__exit__``), at interpreter exit (``atexit``) and when the Python process dies without
cleaning up (``kill -9``): see *Lifetime*.

Serving: only regular files inside the folder. A symbolic link is refused (403; 404 for a path
through a linked folder), wherever it points (nginx's ``disable_symlinks``), and so is a
dotfile or anything under a dot folder (``.git/``, ``.env``): a link into the rest of the
disk, or a secret left beside the shards, is never served.

Lifetime: nginx lives as long as the process that started it, whichever thread started it.
The kernel's parent-death signal does not do this: it fires when the *thread* that forked the
child exits, so a server started from a short-lived thread would be stopped under its users.
nginx is not Python, so it cannot poll its parent the way loader workers do
(:mod:`dataecho.loader.lifetime`); instead a tiny ``sh`` watcher, in a session of its own,
waits on a pipe whose only write end this process holds. When the process dies, however it
dies, the kernel closes that end, the watcher's read ends, and it stops nginx's process group
(SIGTERM, then SIGKILL) and removes the temp folder. A forked child (a DataLoader worker)
inherits the write end, so a server outlives its process by as long as such children do
(loader workers: a tenth of a second). Should the watcher die with its owner (a kill of the
whole session or cgroup), the folder names its owner (pid and start time, in ``owner``): the
next server to start removes every such folder whose owner is gone, stopping an nginx still
running from it.

Bandwidth: nginx's ``limit_rate`` caps each *connection*. Every shard is one HTTP request
(:mod:`dataecho.app.sources.retrying`), and each DataLoader worker streams one shard at a time, so
``n`` workers get up to ``n`` x the cap in total. To cap the total, pass ``total_rate_bytes_per_s``
and the number of concurrent readers (``connections``): each gets an equal share.

nginx paces a capped response by sending a chunk and then waiting ``chunk / rate``; the first
chunk goes out at once. With nginx's default chunk (up to one second's worth) a file smaller
than the per-second cap would arrive unthrottled, so the config sets ``sendfile_max_chunk`` to
1/50 s worth: even a file far smaller than the per-second cap takes its ``size / rate``.

Proxy: with ``proxy=URL`` (an S3 endpoint, say) nginx passes every request on, as it came (the
client's ``Host`` too: a signature over it, as S3's SigV4 makes, holds), and sends the answers
back capped as above: the same cap, chunk and access log. It reads an answer as fast as the
upstream sends it (in memory or its temp folder), so a slow client never holds the upstream up.
"""

from __future__ import annotations

import atexit
import grp
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import NamedTuple

from dataecho import _validate
from dataecho.errors import DataechoError, DataechoValueError

INSTALL_HINT = "apt-get install nginx-light  (or: apt-get install nginx; as root or with sudo)"
_FALLBACK_BINARY = "/usr/sbin/nginx"
# Loopback requests must not go to an http_proxy named in the environment.
_direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class NginxNotFoundError(DataechoError, FileNotFoundError):
    """No nginx binary; the message says how to install one."""


class Request(NamedTuple):
    """A finished request in the access log; ``bytes``: as many as went out before a client left."""

    status: int
    bytes: int
    uri: str  # the path and query asked for


class NginxServer:
    """nginx serving ``root_dir`` read-only (or proxying ``proxy``) at ``self.url``
    (``http://127.0.0.1:<port>``).

    Args:
        root_dir: the folder to serve; or ``proxy``: the server to pass requests on to
            (``http://host:port``), whose answers get the cap. Give exactly one.
        rate_limit_bytes_per_s: cap per connection (``limit_rate``); None for no cap.
        total_rate_bytes_per_s: a total cap shared by ``connections`` concurrent readers
            (each gets ``total / connections``); give at most one of the two caps.
        connections: with ``total_rate_bytes_per_s``: how many read at once (workers x ranks).
        port: the port on 127.0.0.1 (default: a free one).
        binary: the nginx executable (default: ``nginx`` on PATH, else /usr/sbin/nginx).
        startup_timeout_s: how long to wait for nginx to answer HTTP.
    """

    def __init__(
        self,
        root_dir: str | Path | None = None,
        *,
        proxy: str | None = None,
        rate_limit_bytes_per_s: int | None = None,
        total_rate_bytes_per_s: int | None = None,
        connections: int = 1,
        port: int | None = None,
        binary: str | Path | None = None,
        startup_timeout_s: float = 10.0,
    ) -> None:
        if (root_dir is None) == (proxy is None):
            raise DataechoValueError(f"give exactly one of root_dir (a folder to serve, got "
                                     f"{root_dir!r}) and proxy (a server, got {proxy!r})")  # fmt: skip
        self.root_dir = None if root_dir is None else Path(root_dir).resolve()
        self.proxy = None if proxy is None else _check_upstream(proxy)
        if self.root_dir is not None and not self.root_dir.is_dir():
            raise FileNotFoundError(f"NginxServer: root_dir {str(root_dir)!r} is not a folder")
        if rate_limit_bytes_per_s is not None and total_rate_bytes_per_s is not None:
            raise DataechoValueError(
                f"give at most one of rate_limit_bytes_per_s (per connection, got "
                f"{rate_limit_bytes_per_s!r}) and total_rate_bytes_per_s (got "
                f"{total_rate_bytes_per_s!r})"
            )
        connections = _validate.positive_int(connections, name="connections")
        if total_rate_bytes_per_s is not None:
            total = _validate.positive_int(total_rate_bytes_per_s, name="total_rate_bytes_per_s")
            rate_limit_bytes_per_s = max(1, total // connections)
        elif rate_limit_bytes_per_s is not None:
            rate_limit_bytes_per_s = _validate.positive_int(
                rate_limit_bytes_per_s, name="rate_limit_bytes_per_s", hint="or None for no cap"
            )
        self.rate_limit = rate_limit_bytes_per_s  # per connection, bytes/s, or None
        self._fixed_port = None if port is None else _validate.positive_int(port, name="port")
        self.port = self._fixed_port  # the port in use once started
        self.binary = binary
        self.startup_timeout_s = startup_timeout_s
        self.prefix: Path | None = None
        self._proc: subprocess.Popen | None = None
        self._watcher: subprocess.Popen | None = None  # stops nginx once this process is gone
        self._lifeline: int | None = None  # the pipe's write end, held only by this process

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>``, the base for ``ShardDataset``; only while running."""
        if self._proc is None:
            raise RuntimeError("NginxServer is not running; use it as `with NginxServer(...):`")
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        """The nginx master's pid (also its process group id), or None when stopped."""
        return None if self._proc is None else self._proc.pid

    def start(self) -> NginxServer:
        """Start nginx and wait until it answers HTTP; a failure leaves nothing running."""
        if self._proc is not None:
            return self
        binary = find_nginx(self.binary)
        sweep_stale_folders()
        self.prefix = Path(tempfile.mkdtemp(prefix=_PREFIX))
        (self.prefix / _OWNER).write_text(_owner_id(os.getpid()) or "")
        atexit.register(self.stop)
        try:
            for attempt in range(3):  # a free port found here may be taken before nginx binds
                port = self._fixed_port or _free_port()
                self._proc = self._spawn(binary, port)
                self._watch(self._proc.pid, self.prefix)
                if self._wait_ready(port):
                    self.port = port
                    return self
                log = self._logs()
                self._stop_process()
                if self._fixed_port or "in use" not in log or attempt == 2:
                    raise RuntimeError(f"nginx failed to start on 127.0.0.1:{port}:\n{log}")
        except BaseException:  # also Ctrl-C while waiting: nothing may be left running
            self.stop()
            raise
        raise AssertionError("unreachable")

    def stop(self) -> None:
        """Stop nginx and every process of its group, and remove the temp folder. Idempotent."""
        self._stop_process()
        if self.prefix is not None:
            shutil.rmtree(self.prefix, ignore_errors=True)
            self.prefix = None
        atexit.unregister(self.stop)

    def __enter__(self) -> NginxServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def traffic(self) -> dict[str, int]:
        """Successful (200) requests and their body bytes so far, from nginx's access log.

        All connections together (every DataLoader worker); a request counts once finished.
        """
        done = [r for r in self.requests() if r.status == 200]
        return {"requests": len(done), "bytes": sum(r.bytes for r in done)}

    def requests(self) -> list[Request]:
        """Every request finished so far, in the order logged, any status (206 for a range)."""
        if self.prefix is None:
            raise RuntimeError("NginxServer is not running: its access log is gone")
        log = self.prefix / "access.log"
        lines = log.read_text().splitlines() if log.is_file() else []
        return [Request(int(a), int(b), uri) for a, b, uri in (x.split(" ", 2) for x in lines)]

    def describe(self) -> str:
        cap = f"{self.rate_limit / 1e6:.3g} MB/s per connection" if self.rate_limit else "no cap"
        where = self.url if self._proc is not None else "(not running)"
        what = f"proxying {self.proxy}" if self.proxy else f"serving {self.root_dir}"
        return f"nginx at {where} {what} ({cap})"

    def _spawn(self, binary: str, port: int) -> subprocess.Popen:
        assert self.prefix is not None
        conf = self.prefix / "nginx.conf"
        conf.write_text(self._config(port))
        (self.prefix / "error.log").unlink(missing_ok=True)  # only this attempt's errors
        out = open(self.prefix / "stderr.log", "wb")  # noqa: SIM115 (the child holds it)
        with out:
            return subprocess.Popen(
                [binary, "-p", str(self.prefix), "-c", str(conf)],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                start_new_session=True,  # own group: killpg reaches master and workers
            )

    def _watch(self, pgid: int, prefix: Path) -> None:
        """Start the watcher that stops group ``pgid`` and removes ``prefix`` when this
        process's pipe end closes."""
        read_end, self._lifeline = os.pipe()  # not inherited by exec'd children (O_CLOEXEC)
        try:
            self._watcher = subprocess.Popen(
                ["/bin/sh", "-c", _WATCHER, "dataecho-nginx-watcher", str(pgid), str(prefix)],
                stdin=read_end,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,  # a Ctrl-C to the terminal's group does not reach it
            )
        finally:
            os.close(read_end)

    def _config(self, port: int) -> str:
        p = self.prefix
        rate = self.rate_limit or 0  # 0: no limit
        # nginx sends a chunk, then waits chunk / rate. The first chunk goes out unpaced, so a
        # small chunk (1/50 s worth) keeps small files from slipping through under the cap.
        chunk = min(max(rate // 50, 8192), 2 << 20) if rate else 2 << 20
        temps = "\n".join(
            f"    {kind}_temp_path {_q(p / kind)};"
            for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
        )
        # As root, nginx's workers would run as "nobody" and could not read a 0700 temp folder.
        user = ""
        if os.geteuid() == 0:
            user = f"user {pwd.getpwuid(0).pw_name} {grp.getgrgid(os.getegid()).gr_name};"
        serve = root = ""
        if self.root_dir is not None:
            # Regular files inside the folder only: no link (even one inside it: what it points
            # at may change), checked below the root; no dotfile nor dot folder (see *Serving*).
            root = f"""root {_q(self.root_dir)};
        disable_symlinks on from=$document_root;
        location ~ /\\. {{ deny all; }}"""
        else:  # the request as it came, the client's Host included (see *Proxy*)
            serve = f"""proxy_pass {self.proxy}; proxy_http_version 1.1; proxy_buffering on;
            proxy_set_header Host $http_host; proxy_set_header Connection ""; proxy_redirect off;"""
        return f"""daemon off;
master_process on;
worker_processes 1;
{user}
pid {_q(p / "nginx.pid")};
error_log {_q(p / "error.log")} warn;
events {{ worker_connections 256; }}
http {{
    log_format dataecho "$status $body_bytes_sent $request_uri";
    access_log {_q(p / "access.log")} dataecho;
    default_type application/octet-stream;
    sendfile on;
    sendfile_max_chunk {chunk};
    keepalive_timeout 5s;
{temps}
    server {{
        listen 127.0.0.1:{port};
        {root}
        location / {{
            {serve}
            limit_rate {rate};
            limit_rate_after 0;
        }}
    }}
}}
"""

    def _wait_ready(self, port: int) -> bool:
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self._proc is None or self._proc.poll() is not None:
                return False
            try:
                _direct.open(f"http://127.0.0.1:{port}/", timeout=1).close()
                return True
            except urllib.error.HTTPError:  # 403/404: it answers, which is all we wait for
                return True
            except (urllib.error.URLError, OSError):
                time.sleep(0.02)
        return False

    def _logs(self) -> str:
        parts = []
        for name in ("stderr.log", "error.log"):
            path = (self.prefix or Path("/nonexistent")) / name
            if path.is_file() and (text := path.read_text(errors="replace").strip()):
                parts.append(f"[{name}]\n{text}")
        return "\n".join(parts) or "(nginx wrote no log)"

    def _stop_process(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            self._stop_group(proc)
        # The watcher goes after nginx, which is guarded to the end, and is killed before its
        # pipe closes: it never acts on a normal stop, when nginx's group id may be reused.
        watcher, self._watcher = self._watcher, None
        if watcher is not None:
            watcher.kill()
            watcher.wait()
        lifeline, self._lifeline = self._lifeline, None
        if lifeline is not None:
            os.close(lifeline)

    @staticmethod
    def _stop_group(proc: subprocess.Popen) -> None:
        if proc.poll() is None:
            _killpg(proc.pid, signal.SIGTERM)  # nginx: fast shutdown, closes connections
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                _killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        _killpg(proc.pid, signal.SIGKILL)  # any worker that outlived its master


def find_nginx(binary: str | Path | None = None) -> str:
    """The nginx executable: ``binary`` if given, else on PATH, else /usr/sbin/nginx."""
    if binary is not None:
        found = shutil.which(str(binary))
    else:
        found = shutil.which("nginx") or shutil.which(_FALLBACK_BINARY)
    if found is None:
        where = f"{str(binary)!r}" if binary is not None else f"on PATH or at {_FALLBACK_BINARY}"
        raise NginxNotFoundError(
            f"nginx not found ({where}). Install it with:  {INSTALL_HINT}\n"
            "or use the emulated storage instead (dataecho.app.sources.emulated.EmulatedStorage)."
        )
    return found


def group_pids(pgid: int) -> list[int]:
    """Live (not zombie) processes in process group ``pgid``, read from /proc."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # exited while we looked
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            pids.append(int(entry.name))
    return pids


def sweep_stale_folders(temp_dir: str | Path | None = None) -> list[Path]:
    """Remove the ``dataecho-nginx-*`` folders in ``temp_dir`` (default: the temp directory)
    whose owner process is gone, stopping an nginx still running from one; returns them.

    Only this user's folders that name their owner are touched: a folder being created, or
    one whose owner lives (the same pid and start time: a reused pid is another process), is
    left alone.
    """
    removed = []
    for folder in Path(temp_dir or tempfile.gettempdir()).glob(_PREFIX + "*"):
        try:
            if folder.stat().st_uid != os.getuid():
                continue
            owner = (folder / _OWNER).read_text().split()
        except OSError:  # not ours to read, or no owner written yet: in use or being made
            continue
        if len(owner) != 2 or not owner[0].isdigit() or _owner_id(int(owner[0])) == " ".join(owner):
            continue
        _stop_orphan(folder)
        shutil.rmtree(folder, ignore_errors=True)
        removed.append(folder)
    return removed


def _owner_id(pid: int) -> str | None:
    """``"pid start_time"`` of a live process (start in clock ticks since boot), else None."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] == "Z" else f"{pid} {fields[19]}"


def _stop_orphan(folder: Path) -> None:
    """SIGKILL the group of an nginx still running from ``folder`` (its command line names
    the folder's config, so a reused pid is never hit)."""
    try:
        pid = int((folder / "nginx.pid").read_text().split()[0])
        # nginx rewrites its title ("nginx: master process ... -c FOLDER/nginx.conf").
        command = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, ValueError, IndexError):
        return
    if str(folder / "nginx.conf").encode() in command:
        _killpg(pid, signal.SIGKILL)


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _check_upstream(url: str) -> str:
    """``url`` as nginx's ``proxy_pass`` takes it: ``http://host:port``, no path."""
    parts = urllib.parse.urlsplit(str(url))
    odd = any(c in str(url) for c in " ;{}\"'\n")  # nothing that could break the config
    if parts.scheme != "http" or not parts.hostname or parts.path not in ("", "/") or odd:
        raise DataechoValueError(f"proxy must be an upstream server as http://host:port (no "
                                 f"path), got {url!r}; e.g. proxy='http://127.0.0.1:9000'")  # fmt: skip
    return f"http://{parts.netloc}"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _q(path: Path) -> str:
    """A path as a quoted nginx config string."""
    return '"' + str(path).replace("\\", "\\\\").replace('"', '\\"') + '"'


_PREFIX = "dataecho-nginx-"
_OWNER = "owner"  # in the temp folder: "pid start_time" of the process that started nginx

# The watcher: `read` returns at end of file, when the owner's write end is closed (the owner
# died), then nginx's group ($1) gets SIGTERM (a fast shutdown) and SIGKILL if it lingers, and
# the temp folder ($2) goes.
_WATCHER = """read -r _
kill -TERM -$1 2>/dev/null
tries=0
while kill -0 -$1 2>/dev/null && [ $tries -lt 50 ]; do sleep 0.1; tries=$((tries + 1)); done
kill -KILL -$1 2>/dev/null
rm -rf -- "$2"
"""
