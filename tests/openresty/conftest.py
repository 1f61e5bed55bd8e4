"""A real nginx with Debian's lua-nginx-module (libnginx-mod-http-lua, LuaJIT
2.1 from luajit2) running the LuaJIT module as an OpenResty user installs it:
the rock (hosts/luajit/chstate-luajit-scm-1.rockspec) made into a LuaRocks tree
outside the checkout, and nginx's lua_package_path/cpath pointing at that tree
alone (no CHSTATE_LIBRARY). One nginx process serves every request
(`master_process off`), so a request that blocked it would hold up all others:
test_nginx.py measures exactly that.

`nginx`: the running server, with `get(path, **args)` -> (status, text, seconds)
and `error_log()`.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

from chserver import REPO
sys.path.insert(0, str(REPO / "tools"))
from clickhouse_server import free_port  # noqa: E402  (below the ephemeral range)

MODULES = Path("/usr/lib/nginx/modules")

# The locations: each opens a store per request (no I/O until the first
# call), answers, and closes it. Errors answer 500 with the error's text.
LOCATIONS = r"""
    location = /set {
      content_by_lua_block {
        local chstate = require "chstate"
        local store = chstate.open{schema = ngx.var.arg_schema}
        store:set(ngx.unescape_uri(ngx.var.arg_id), chstate.from_json(ngx.unescape_uri(ngx.var.arg_state)))
        store:close()
        ngx.say("ok")
      }
    }
    location = /get {
      content_by_lua_block {
        local chstate = require "chstate"
        local store = chstate.open{schema = ngx.var.arg_schema}
        local state = store:get(ngx.unescape_uri(ngx.var.arg_id))
        store:close()
        ngx.say(chstate.to_json(state or chstate.null))
      }
    }
    location = /merge {
      content_by_lua_block {
        local chstate = require "chstate"
        local store = chstate.open{schema = ngx.var.arg_schema}  -- lock_retry: 1 s
        local merged = store:merge(ngx.unescape_uri(ngx.var.arg_id),
                                   {singer_state = {[ngx.var.arg_key] = tonumber(ngx.var.arg_n)}})
        store:close()
        ngx.say(chstate.to_json(merged))
      }
    }
    location = /hold {
      content_by_lua_block {
        local chstate = require "chstate"
        local store = chstate.open{schema = ngx.var.arg_schema}
        store:with_lock(ngx.unescape_uri(ngx.var.arg_id), function() ngx.sleep(tonumber(ngx.var.arg_seconds)) end)
        store:close()
        ngx.say("held")
      }
    }
    location = /sleeper {
      # A lock scope whose function sleeps (arg_seconds) without a store call,
      # with a 1 s validity: a light thread renews the lock meanwhile. With
      # arg_block=1 it sleeps blocking the worker (the control: nothing else runs).
      content_by_lua_block {
        local chstate = require "chstate"
        local store = chstate.open{schema = ngx.var.arg_schema, lock_timeout_seconds = 1}
        local id = ngx.unescape_uri(ngx.var.arg_id)
        local seconds = tonumber(ngx.var.arg_seconds)
        local ok, err = pcall(store.with_lock, store, id, function()
          store:set(id, {singer_state = {holder = "in"}})
          if ngx.var.arg_block == "1" then
            local ffi = require "ffi"
            pcall(ffi.cdef, "int poll(void* fds, unsigned long nfds, int timeout);")
            ffi.C.poll(nil, 0, seconds * 1000)
          else
            ngx.sleep(seconds)
          end
          return "held"
        end)
        local background = store:renews_in_background()
        store:close()
        ngx.say(tostring(background), " ", ok and err or (tostring(err.code) .. " " .. tostring(err.message)))
      }
    }
    location = /busy {
      # A lock scope (1 s validity) whose function reads the state every
      # few milliseconds for arg_seconds, while the lock is renewed in the
      # background in between: the renewal must never make one of these calls fail.
      content_by_lua_block {
        local chstate = require "chstate"
        local store = chstate.open{schema = ngx.var.arg_schema, lock_timeout_seconds = 1}
        local id = ngx.unescape_uri(ngx.var.arg_id)
        local calls, failures, first = 0, 0, nil
        local ok, err = pcall(store.with_lock, store, id, function()
          local deadline = ngx.now() + tonumber(ngx.var.arg_seconds)
          while ngx.now() < deadline do
            local got, e = pcall(store.get, store, id)
            calls = calls + 1
            if not got then
              failures = failures + 1
              first = first or tostring(e)
            end
            ngx.sleep(0.002)
            ngx.update_time()
          end
        end)
        store:close()
        ngx.say(calls, " ", failures, " ", ok and "held" or tostring(err), " ", tostring(first))
      }
    }
    location = /abandon {
      # A request that ends (ngx.exit) inside a lock scope with a 1 s
      # validity: with_lock never returns and the store is never closed.
      content_by_lua_block {
        local chstate = require "chstate"
        local store = chstate.open{schema = ngx.var.arg_schema, lock_timeout_seconds = 1}
        store:with_lock(ngx.unescape_uri(ngx.var.arg_id), function()
          ngx.say("abandoned")
          ngx.exit(ngx.HTTP_OK)
        end)
        ngx.say("not reached")
      }
    }
    location = /block {
      # The control: a blocking wait inside the worker, as a module without
      # cosockets would make one.
      content_by_lua_block {
        local ffi = require "ffi"
        pcall(ffi.cdef, "int poll(void* fds, unsigned long nfds, int timeout);")
        ffi.C.poll(nil, 0, tonumber(ngx.var.arg_seconds) * 1000)
        ngx.say("blocked")
      }
    }
    location = /told {
      # What the store tells, to an on_event callback (not the error log): each line, one per line.
      content_by_lua_block {
        local chstate = require "chstate"
        local lines = {}
        local store = chstate.open{schema = ngx.var.arg_schema, diagnostics = "debug",
                                   on_event = function(e) lines[#lines + 1] = e.level .. " " .. e.kind .. " " .. e.line end}
        store:set(ngx.unescape_uri(ngx.var.arg_id), {singer_state = {bookmark = ngx.var.arg_bookmark}})
        store:close()
        ngx.say(table.concat(lines, "\n"))
      }
    }
    location = /pong {
      content_by_lua_block { ngx.say("pong") }
    }
    location = /dead {
      content_by_lua_block {
        local chstate = require "chstate"
        local store = chstate.safe.open{host = "127.0.0.1", port = 1, user = "u", password = "s3cret-nginx",
                                        database = "default", env = false}
        local ok, message, code = store:ping()
        ngx.say(tostring(code), " ", tostring(message))
      }
    }
    location = /silent {
      # A server that accepts connections and never answers (arg_port).
      content_by_lua_block {
        local chstate = require "chstate"
        local store = chstate.safe.open{host = "127.0.0.1", port = ngx.var.arg_port, user = "u",
                                        database = "default", env = false, request_timeout_seconds = 1}
        local ok, message, code = store:ping()
        ngx.say(tostring(code), " ", tostring(message))
      }
    }
    location = /which {
      content_by_lua_block {
        local chstate = require "chstate"
        ngx.say(chstate._LIBRARY, " ", tostring(chstate.null == ngx.null))
      }
    }
"""

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


@dataclass
class Nginx:
    port: int
    folder: Path
    tree: Path

    def get(self, path: str, timeout: float = 60, **args) -> tuple[int, str, float]:
        url = f"http://127.0.0.1:{self.port}{path}?" + urllib.parse.urlencode({k: str(v) for k, v in args.items()})
        start = time.monotonic()
        try:
            with urllib.request.urlopen(url, timeout=timeout) as r:
                return r.status, r.read().decode(), time.monotonic() - start
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode(), time.monotonic() - start

    def error_log(self) -> str:
        path = self.folder / "error.log"
        return path.read_text(errors="replace") if path.exists() else ""



@pytest.fixture(scope="session")
def nginx(clickhouse):
    for tool in ("nginx", "luarocks", "bazel"):
        assert shutil.which(tool) or Path(f"/usr/sbin/{tool}").exists(), f"{tool} is missing: run tools/setup"
    assert (MODULES / "ngx_http_lua_module.so").exists(), "libnginx-mod-http-lua is missing: run tools/setup"
    folder = Path(tempfile.mkdtemp(prefix="chstate-nginx-"))
    tree = folder / "rocks"
    made = subprocess.run(["luarocks", "--lua-version=5.1", f"--tree={tree}", "make",
                           "hosts/luajit/chstate-luajit-scm-1.rockspec"], cwd=REPO, capture_output=True, text=True)
    assert made.returncode == 0, f"luarocks make failed:\n{made.stdout}\n{made.stderr}"
    port = free_port()
    conf = folder / "nginx.conf"
    conf.write_text(CONFIG.format(dir=folder, modules=MODULES, tree=tree, port=port, locations=LOCATIONS))
    env = {"PATH": "/usr/sbin:/usr/bin:/bin",
           "MELTANO_STATE_BACKEND_URI": clickhouse.uri(),
           "MELTANO_STATE_BACKEND_CLICKHOUSE_PASSWORD": clickhouse.password}
    proc = subprocess.Popen(["nginx", "-c", str(conf), "-p", str(folder)], env=env, cwd=folder,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    server = Nginx(port, folder, tree)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                if server.get("/pong", timeout=2)[0] == 200:
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
        shutil.rmtree(folder, ignore_errors=True)
