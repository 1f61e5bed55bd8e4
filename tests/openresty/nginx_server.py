"""A real nginx with Debian's lua-nginx-module (libnginx-mod-http-lua, LuaJIT
2.1 from luajit2) running the LuaJIT module as an OpenResty user installs it:
the rock (hosts/luajit/chstate-luajit-scm-1.rockspec) made into a LuaRocks tree
outside the checkout, and nginx's lua_package_path/cpath pointing at that tree
alone (no CHSTATE_LIBRARY). One nginx process serves every request
(`master_process off`).

`running_nginx(uri, password, locations)`: a context manager that checks what
is installed (`NginxMissing`, an AssertionError saying to run tools/setup),
makes the rock, starts nginx with MELTANO_STATE_BACKEND_URI = uri (and the
password) in its environment and the given `location` blocks in its one
server, waits until it answers, yields an `Nginx`, and stops it and removes
its folder at the end. Used by tests/openresty/conftest.py and by
tests/faults/test_histories.py (whose nginx talks to a fault proxy).
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tools"))
from clickhouse_server import free_port  # noqa: E402  (below the ephemeral range)

MODULES = Path("/usr/lib/nginx/modules")
ROCKSPEC = "hosts/luajit/chstate-luajit-scm-1.rockspec"

CONFIG = """
daemon off;
master_process off;
worker_processes 1;
error_log {dir}/error.log info;
pid {dir}/nginx.pid;
load_module {modules}/ndk_http_module.so;
load_module {modules}/ngx_http_lua_module.so;
env MELTANO_STATE_BACKEND_URI;
env MELTANO_STATE_BACKEND_CLICKHOUSE_PASSWORD;
events {{ worker_connections 256; }}
http {{
  access_log off;
  client_body_temp_path {dir}/body;
  proxy_temp_path {dir}/proxy;
  fastcgi_temp_path {dir}/fastcgi;
  uwsgi_temp_path {dir}/uwsgi;
  scgi_temp_path {dir}/scgi;
  lua_package_path "{tree}/share/lua/5.1/?.lua;;";
  lua_package_cpath "{tree}/lib/lua/5.1/?.so;;";
  server {{
    listen 127.0.0.1:{port};
{locations}
  }}
}}
"""


class NginxMissing(AssertionError):
    """nginx, luarocks, bazel or the Lua module is not installed."""


@dataclass
class Nginx:
    port: int
    folder: Path
    tree: Path

    def get(self, path: str, timeout: float = 60, **args) -> tuple[int, str, float]:
        url = f"http://127.0.0.1:{self.port}{path}?" + urllib.parse.urlencode({k: str(v) for k, v in args.items()})
        return self._open(url, None, timeout)

    def post(self, path: str, body: bytes, timeout: float = 60, **args) -> tuple[int, str, float]:
        url = f"http://127.0.0.1:{self.port}{path}?" + urllib.parse.urlencode({k: str(v) for k, v in args.items()})
        return self._open(url, body, timeout)

    def _open(self, url: str, body: bytes | None, timeout: float) -> tuple[int, str, float]:
        start = time.monotonic()
        try:
            with urllib.request.urlopen(url, data=body, timeout=timeout) as r:
                return r.status, r.read().decode(), time.monotonic() - start
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode(), time.monotonic() - start

    def error_log(self) -> str:
        path = self.folder / "error.log"
        return path.read_text(errors="replace") if path.exists() else ""


def check_installed() -> None:
    """Raises NginxMissing (saying to run tools/setup) when a tool or the Lua module is missing."""
    for tool in ("nginx", "luarocks", "bazel"):
        if not (shutil.which(tool) or Path(f"/usr/sbin/{tool}").exists()):
            raise NginxMissing(f"{tool} is missing: run tools/setup")
    if not (MODULES / "ngx_http_lua_module.so").exists():
        raise NginxMissing("libnginx-mod-http-lua is missing: run tools/setup")


@contextlib.contextmanager
def running_nginx(uri: str, password: str, locations: str) -> Iterator[Nginx]:
    check_installed()
    folder = Path(tempfile.mkdtemp(prefix="chstate-nginx-"))
    try:
        tree = folder / "rocks"
        made = subprocess.run(["luarocks", "--lua-version=5.1", f"--tree={tree}", "make", ROCKSPEC],
                              cwd=REPO, capture_output=True, text=True)
        assert made.returncode == 0, f"luarocks make failed:\n{made.stdout}\n{made.stderr}"
        port = free_port()
        conf = folder / "nginx.conf"
        conf.write_text(CONFIG.format(dir=folder, modules=MODULES, tree=tree, port=port, locations=locations))
        env = {"PATH": "/usr/sbin:/usr/bin:/bin",
               "MELTANO_STATE_BACKEND_URI": uri,
               "MELTANO_STATE_BACKEND_CLICKHOUSE_PASSWORD": password}
        proc = subprocess.Popen(["nginx", "-c", str(conf), "-p", str(folder)], env=env, cwd=folder,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        server = Nginx(port, folder, tree)
        try:
            deadline = time.monotonic() + 20
            while True:
                try:
                    server.get("/", timeout=2)  # any HTTP answer (a 404 too): nginx is serving
                    break
                except OSError:
                    pass
                assert proc.poll() is None, f"nginx exited with {proc.returncode}:\n{server.error_log()}"
                assert time.monotonic() < deadline, f"nginx did not answer:\n{server.error_log()}"
                time.sleep(0.1)
            yield server
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
