/* Deny-all definitions of the few WASI preview1 functions (and one
 * Emscripten notification) that libc and abseil reference, linked into the
 * module so that it imports NOTHING: a plugin runtime instantiates it with an
 * empty import object, and the module provably has no clock, environment,
 * files or exit of its own.
 *
 * None of them is reached when the core runs: the core takes time and random
 * bytes as inputs, and what references these is library code the module only
 * links (abseil's Mutex timeouts and time zones, which a single-threaded
 * module never waits on or formats; stdio and abseil's fatal-error logging).
 * They answer as an empty sandbox would:
 *   clock_time_get      time 0 (abseil aborts on a failing clock; 0 never matters here)
 *   environ_*           an empty environment
 *   fd_write            output discarded (reported as written so nothing loops)
 *   proc_exit           trap (only abort() exits, and it is a bug either way)
 *   emscripten_notify_memory_growth   nothing to notify
 * Signatures are spelled with plain types on purpose: including <wasi/api.h>
 * would mark these very definitions as imports.
 */
#include <stddef.h>
#include <stdint.h>

typedef struct {
  const uint8_t* buf;
  size_t len;
} ciovec;

uint16_t __wasi_fd_write(int32_t fd, const ciovec* iovs, size_t iovs_len, size_t* nwritten) {
  size_t total = 0;
  (void)fd;
  for (size_t i = 0; i < iovs_len; ++i) total += iovs[i].len;
  *nwritten = total;
  return 0;
}

/* Emscripten's standalone runtime (_emscripten_out/_emscripten_err) writes
 * through this alias of fd_write. */
uint16_t imported__wasi_fd_write(int32_t fd, const ciovec* iovs, size_t iovs_len, size_t* nwritten) {
  return __wasi_fd_write(fd, iovs, iovs_len, nwritten);
}

uint16_t __wasi_clock_time_get(uint32_t clock_id, uint64_t precision, uint64_t* time) {
  (void)clock_id;
  (void)precision;
  *time = 0;
  return 0;
}

uint16_t __wasi_environ_sizes_get(size_t* count, size_t* buf_size) {
  *count = 0;
  *buf_size = 0;
  return 0;
}

uint16_t __wasi_environ_get(uint8_t** environ, uint8_t* environ_buf) {
  (void)environ;
  (void)environ_buf;
  return 0;
}

_Noreturn void __wasi_proc_exit(uint32_t code) {
  (void)code;
  __builtin_trap();
}

void emscripten_notify_memory_growth(size_t memory_index) { (void)memory_index; }
