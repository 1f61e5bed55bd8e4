"""A real nginx with Debian's lua-nginx-module (libnginx-mod-http-lua, LuaJIT
2.1 from luajit2) running the LuaJIT module as an OpenResty user installs it:
the rock (hosts/luajit/chstate-luajit-scm-1.rockspec) made into a LuaRocks tree
outside the checkout, and nginx's lua_package_path/cpath pointing at that tree
alone (no CHSTATE_LIBRARY). One nginx process serves every request
(`master_process off`), so a request that blocked it would hold up all others:
test_nginx.py measures exactly that. Starting and stopping it is
nginx_server.py's (tests/faults/test_histories.py starts one too).

`nginx`: the running server, with `get(path, **args)` -> (status, text, seconds)
and `error_log()`.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from nginx_server import Nginx, running_nginx  # noqa: E402,F401  (Nginx: for type hints)

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


@pytest.fixture(scope="session")
def nginx(clickhouse):
    with running_nginx(clickhouse.uri(), clickhouse.password, LOCATIONS) as server:
        yield server
