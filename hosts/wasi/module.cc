// The WebAssembly face of chstate: a WASI reactor module whose exports wrap
// the sans-IO C ABI of hosts/common/chstate.h (the same code the native
// Python adapter loads), reshaped for a host that can only pass integers and
// copy bytes in and out of the module's memory. The module imports nothing
// it needs: the host runs the SQL the core asks for and passes the time and
// random bytes with every call. README.md "Plugin runtimes (WebAssembly)"
// walks through it; hosts/wasi/chstate_wasi.mjs is the tested Node host.
//
//   ptr  = chstate_alloc(n)                 // a block in module memory
//   ... host writes n bytes of UTF-8 JSON at ptr ...
//   r    = chstate_store_new(ptr, n, out, cap)        // a settings document -> {"store":1,"settings":{...}}
//                                                     // or {"failed":...}
//   r    = chstate_op_start(1, op, op_len, now_ms, rnd, 32, out, cap)
//   while the document at `out` is {"request":...} / {"wait_ms":N}:
//     ... run the SQL or sleep ...
//     r  = chstate_op_feed(1, answer, answer_len, now_ms, rnd, 32, out, cap)
//   chstate_store_free(1); chstate_free(ptr); ...
//
// Calling convention of every export that produces a document (resolve
// config, store_new, op_start, op_feed, last):
//   - The result is always one UTF-8 JSON document, never empty and never
//     truncated. It is kept in the module's outbox until the next such call.
//   - r > 0: the document is r bytes long and was copied to out[0..r).
//   - r < 0: nothing was written to `out` (the buffer was smaller than -r
//     bytes, or not a live chstate_alloc block); call chstate_last(out2, cap2)
//     with a buffer of at least -r bytes to copy the same document. The
//     operation has already advanced: never call op_start/op_feed again just
//     to get a bigger copy.
// Memory ownership: the host owns every block it gets from chstate_alloc
// until it passes it to chstate_free; every pointer argument must lie inside
// one live block (anything else is an error document, never a read or write
// elsewhere), is borrowed for the call only, and is never kept. The module
// owns its outbox and the stores; a store handle is a small positive integer
// valid from chstate_store_new until chstate_store_free.
// Errors: bad input of any kind (bad handle, pointer, length, UTF-8, JSON,
// call order) is a {"failed":{"code":...,"message":...}} document. ABI-level
// errors (buffers, handles, UTF-8, size, nesting) are checked before the
// store is touched, so a running operation survives them; a well-formed
// document the protocol rejects ends the running operation as in
// hosts/common/protocol.h. The module traps only if it runs out of memory
// (limits below keep documents far from that).
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "hosts/common/chstate.h"
#include "hosts/common/protocol.h"

#define CHSTATE_EXPORT(name) extern "C" __attribute__((export_name(name), used))

namespace {

// Version of this module's export list and calling convention (the JSON
// documents are versioned by CHSTATE_ABI_VERSION, reported alongside).
// 2: settings documents, the verb table, store_new says how to connect;
// 3: the settings table (the Meltano adapter's settings where it runs this module).
constexpr int32_t kWasmAbiVersion = 3;

// Largest block chstate_alloc hands out and largest document accepted.
// A state of 16 MiB parses into a few hundred MiB of tree at worst, well
// inside the module's 2 GiB memory limit.
constexpr uint32_t kMaxDocumentBytes = 16u << 20;
// Random bytes per call: the core needs 16; more than this is a host bug.
constexpr uint32_t kMinRandomBytes = 16;
constexpr uint32_t kMaxRandomBytes = 4096;
// Nesting the whole document may have (the state model allows 512 below
// "state"); deeper text is refused before anything recurses over it.
constexpr int kMaxDocumentDepth = 520;
constexpr int32_t kMaxStores = 1 << 14;

std::string& Outbox() {
  static std::string* box = new std::string();
  return *box;
}

// Live blocks handed out by chstate_alloc: start -> size.
std::map<uint32_t, uint32_t>& Blocks() {
  static auto* blocks = new std::map<uint32_t, uint32_t>();
  return *blocks;
}

struct Slot {
  uint32_t generation = 0;
  chstate_store* store = nullptr;
};

std::vector<Slot>& Slots() {
  static auto* slots = new std::vector<Slot>();
  return *slots;
}

std::string Failed(const absl::Status& status) {
  return chstate::protocol::Dump(chstate::protocol::FailedJson(status));
}

// True if [ptr, ptr+len) lies inside one live block.
bool InsideBlock(uint32_t ptr, uint32_t len) {
  auto& blocks = Blocks();
  auto it = blocks.upper_bound(ptr);
  if (it == blocks.begin()) return false;
  --it;
  uint64_t end = static_cast<uint64_t>(ptr) + len;
  return ptr >= it->first && end <= static_cast<uint64_t>(it->first) + it->second;
}

absl::Status CheckBlock(uint32_t ptr, uint32_t len, absl::string_view what) {
  if (len == 0) return absl::OkStatus();  // nothing is read or written
  if (!InsideBlock(ptr, len)) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " [", ptr, ", ", static_cast<uint64_t>(ptr) + len,
        ") is not inside a live block from chstate_alloc: allocate it there, and do not use it after chstate_free"));
  }
  return absl::OkStatus();
}

// UTF-8 as RFC 3629 defines it (no surrogates, no overlongs, <= U+10FFFF);
// no NUL (JSON text never has one, and the C ABI takes NUL-terminated text);
// nesting no deeper than kMaxDocumentDepth outside strings.
absl::Status CheckText(absl::string_view text, absl::string_view what) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  size_t n = text.size();
  int depth = 0;
  bool in_string = false;
  bool escaped = false;
  for (size_t i = 0; i < n;) {
    unsigned char c = s[i];
    if (c == 0) {
      return absl::InvalidArgumentError(absl::StrCat(what, " has a NUL byte at offset ", i,
                                                     "; JSON text never contains one (write \\u0000 in a string)"));
    }
    if (c < 0x80) {
      if (in_string) {
        if (escaped) {
          escaped = false;
        } else if (c == '\\') {
          escaped = true;
        } else if (c == '"') {
          in_string = false;
        }
      } else if (c == '"') {
        in_string = true;
      } else if (c == '[' || c == '{') {
        if (++depth > kMaxDocumentDepth) {
          return absl::InvalidArgumentError(absl::StrCat(what, " nests deeper than ", kMaxDocumentDepth,
                                                         " levels at offset ", i, "; a Meltano state is a few levels deep"));
        }
      } else if ((c == ']' || c == '}') && depth > 0) {
        --depth;
      }
      ++i;
      continue;
    }
    escaped = false;
    size_t len = 0;
    uint32_t cp = 0;
    uint32_t min = 0;
    if ((c & 0xE0) == 0xC0) {
      len = 2, cp = c & 0x1F, min = 0x80;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3, cp = c & 0x0F, min = 0x800;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4, cp = c & 0x07, min = 0x10000;
    }
    bool ok = len != 0 && i + len <= n;
    for (size_t k = 1; ok && k < len; ++k) {
      ok = (s[i + k] & 0xC0) == 0x80;
      cp = (cp << 6) | (s[i + k] & 0x3F);
    }
    ok = ok && cp >= min && cp <= 0x10FFFF && !(cp >= 0xD800 && cp <= 0xDFFF);
    if (!ok) {
      return absl::InvalidArgumentError(absl::StrCat(what, " is not valid UTF-8 at offset ", i,
                                                     "; documents are UTF-8 JSON (binary state ids travel as hex)"));
    }
    i += len;
  }
  return absl::OkStatus();
}

// Reads a document argument: checked, copied, NUL-terminated for the C ABI.
absl::Status ReadDocument(uint32_t ptr, uint32_t len, absl::string_view what, std::string* out) {
  if (len > kMaxDocumentBytes) {
    return absl::InvalidArgumentError(absl::StrCat(what, " is ", len, " bytes; the limit is ", kMaxDocumentBytes,
                                                   " (16 MiB)"));
  }
  if (absl::Status s = CheckBlock(ptr, len, what); !s.ok()) return s;
  absl::string_view text(len == 0 ? "" : reinterpret_cast<const char*>(static_cast<uintptr_t>(ptr)), len);
  if (absl::Status s = CheckText(text, what); !s.ok()) return s;
  out->assign(text.data(), text.size());
  return absl::OkStatus();
}

// Puts `doc` in the outbox and delivers it by the convention above.
int32_t Deliver(std::string doc, uint32_t out_ptr, uint32_t out_cap) {
  std::string& box = Outbox();
  box = std::move(doc);
  auto n = static_cast<int32_t>(box.size());
  if (box.size() > out_cap || !InsideBlock(out_ptr, static_cast<uint32_t>(box.size()))) return -n;
  std::memcpy(reinterpret_cast<void*>(static_cast<uintptr_t>(out_ptr)), box.data(), box.size());
  return n;
}

// Takes ownership of a string from the C ABI.
std::string Take(char* s) {
  if (s == nullptr) return Failed(absl::ResourceExhaustedError("the module ran out of memory"));
  std::string out(s);
  chstate_string_free(s);
  return out;
}

chstate_store* Lookup(int32_t handle) {
  if (handle <= 0) return nullptr;
  auto index = static_cast<uint32_t>(handle & 0xFFFF) - 1;
  auto generation = static_cast<uint32_t>(handle) >> 16;
  auto& slots = Slots();
  if (index >= slots.size() || slots[index].generation != generation) return nullptr;
  return slots[index].store;
}

absl::Status BadHandle(int32_t handle) {
  return absl::InvalidArgumentError(absl::StrCat(
      "store handle ", handle, " is not open: use the number chstate_store_new returned, before chstate_store_free"));
}

int32_t Operation(bool start, int32_t handle, uint32_t doc_ptr, uint32_t doc_len, int64_t now_ms, uint32_t rnd_ptr,
                  uint32_t rnd_len, uint32_t out_ptr, uint32_t out_cap) {
  chstate_store* store = Lookup(handle);
  if (store == nullptr) return Deliver(Failed(BadHandle(handle)), out_ptr, out_cap);
  // Every argument is checked before the store sees anything.
  absl::Status status = CheckBlock(out_ptr, out_cap, "output buffer");
  if (status.ok() && (rnd_len < kMinRandomBytes || rnd_len > kMaxRandomBytes)) {
    status = absl::InvalidArgumentError(absl::StrCat("random_len is ", rnd_len, "; pass ", kMinRandomBytes, " to ",
                                                     kMaxRandomBytes, " fresh bytes from a cryptographic source"));
  }
  if (status.ok()) status = CheckBlock(rnd_ptr, rnd_len, "random bytes");
  std::string doc;
  if (status.ok()) status = ReadDocument(doc_ptr, doc_len, start ? "op document" : "answer document", &doc);
  if (!status.ok()) return Deliver(Failed(status), out_ptr, out_cap);
  const auto* random = reinterpret_cast<const unsigned char*>(static_cast<uintptr_t>(rnd_ptr));
  char* result = start ? chstate_op_start(store, doc.c_str(), now_ms, random, rnd_len)
                       : chstate_op_feed(store, doc.c_str(), now_ms, random, rnd_len);
  return Deliver(Take(result), out_ptr, out_cap);
}

}  // namespace

CHSTATE_EXPORT("chstate_abi_version") int32_t wasm_abi_version() { return chstate_abi_version(); }

CHSTATE_EXPORT("chstate_wasm_abi_version") int32_t wasm_wasm_abi_version() { return kWasmAbiVersion; }

// A block of `size` bytes (1..16 MiB) owned by the host until chstate_free;
// 0 if the size is out of range or memory ran out.
CHSTATE_EXPORT("chstate_alloc") uint32_t wasm_alloc(uint32_t size) {
  if (size == 0 || size > kMaxDocumentBytes) return 0;
  void* p = std::malloc(size);
  if (p == nullptr) return 0;
  auto ptr = static_cast<uint32_t>(reinterpret_cast<uintptr_t>(p));
  Blocks()[ptr] = size;
  return ptr;
}

// Frees a block from chstate_alloc: 0, or -1 (and nothing happens) when `ptr`
// is not the start of a live block (a double free, a foreign pointer). 0 is
// accepted and ignored.
CHSTATE_EXPORT("chstate_free") int32_t wasm_free(uint32_t ptr) {
  if (ptr == 0) return 0;
  auto& blocks = Blocks();
  auto it = blocks.find(ptr);
  if (it == blocks.end()) return -1;
  blocks.erase(it);
  std::free(reinterpret_cast<void*>(static_cast<uintptr_t>(ptr)));
  return 0;
}

// Copies the outbox (the last document) again; same convention as the rest.
CHSTATE_EXPORT("chstate_last") int32_t wasm_last(uint32_t out_ptr, uint32_t out_cap) {
  std::string& box = Outbox();
  if (box.empty()) box = Failed(absl::FailedPreconditionError("no document yet: call another chstate_ function first"));
  auto n = static_cast<int32_t>(box.size());
  if (box.size() > out_cap || !InsideBlock(out_ptr, static_cast<uint32_t>(box.size()))) return -n;
  std::memcpy(reinterpret_cast<void*>(static_cast<uintptr_t>(out_ptr)), box.data(), box.size());
  return n;
}

// chstate_resolve_settings of chstate.h: a settings document ->
// {"settings":{...}} or {"failed":...}. The module has no environment of its
// own: the host passes the variables it wants considered.
CHSTATE_EXPORT("chstate_resolve_settings")
int32_t wasm_resolve_settings(uint32_t in_ptr, uint32_t in_len, uint32_t out_ptr, uint32_t out_cap) {
  std::string doc;
  absl::Status status = ReadDocument(in_ptr, in_len, "settings document", &doc);
  if (!status.ok()) return Deliver(Failed(status), out_ptr, out_cap);
  return Deliver(Take(chstate_resolve_settings(doc.c_str())), out_ptr, out_cap);
}

// The verb table (chstate_verbs of chstate.h).
CHSTATE_EXPORT("chstate_verbs") int32_t wasm_verbs(uint32_t out_ptr, uint32_t out_cap) {
  return Deliver(Take(chstate_verbs()), out_ptr, out_cap);
}

// The settings table (chstate_settings_table of chstate.h).
CHSTATE_EXPORT("chstate_settings_table") int32_t wasm_settings_table(uint32_t out_ptr, uint32_t out_cap) {
  return Deliver(Take(chstate_settings_table()), out_ptr, out_cap);
}

// A settings document (chstate.h chstate_store_new) ->
// {"store": HANDLE, "settings": {...}} or {"failed": ...}.
CHSTATE_EXPORT("chstate_store_new")
int32_t wasm_store_new(uint32_t in_ptr, uint32_t in_len, uint32_t out_ptr, uint32_t out_cap) {
  std::string doc;
  absl::Status status = ReadDocument(in_ptr, in_len, "settings document", &doc);
  auto& slots = Slots();
  size_t index = 0;
  while (index < slots.size() && slots[index].store != nullptr) ++index;
  if (status.ok() && index >= static_cast<size_t>(kMaxStores)) {
    status = absl::ResourceExhaustedError(
        absl::StrCat("already ", kMaxStores, " stores open: free the ones no longer used with chstate_store_free"));
  }
  if (!status.ok()) return Deliver(Failed(status), out_ptr, out_cap);
  char* error = nullptr;
  chstate_store* store = chstate_store_new(doc.c_str(), &error);
  if (store == nullptr) return Deliver(Take(error), out_ptr, out_cap);
  if (index == slots.size()) slots.emplace_back();
  Slot& slot = slots[index];
  slot.generation = (slot.generation + 1) & 0x7FFF;  // handles stay positive
  if (slot.generation == 0) slot.generation = 1;
  slot.store = store;
  auto handle = static_cast<int32_t>((slot.generation << 16) | (index + 1));
  // What it was opened with: where to connect (the host's transport needs it).
  std::string settings = Take(chstate_store_settings(store));
  return Deliver(absl::StrCat("{\"store\":", handle, ",", settings.substr(1)), out_ptr, out_cap);
}

// Releases a store and its unfinished operation: 0, or -1 for a handle that is
// not open (nothing happens).
CHSTATE_EXPORT("chstate_store_free") int32_t wasm_store_free(int32_t handle) {
  chstate_store* store = Lookup(handle);
  if (store == nullptr) return -1;
  Slot& slot = Slots()[static_cast<uint32_t>(handle & 0xFFFF) - 1];
  slot.store = nullptr;
  chstate_store_free(store);
  return 0;
}

// chstate_op_start / chstate_op_feed of chstate.h.
CHSTATE_EXPORT("chstate_op_start")
int32_t wasm_op_start(int32_t handle, uint32_t doc_ptr, uint32_t doc_len, int64_t now_ms, uint32_t rnd_ptr,
                      uint32_t rnd_len, uint32_t out_ptr, uint32_t out_cap) {
  return Operation(true, handle, doc_ptr, doc_len, now_ms, rnd_ptr, rnd_len, out_ptr, out_cap);
}

CHSTATE_EXPORT("chstate_op_feed")
int32_t wasm_op_feed(int32_t handle, uint32_t doc_ptr, uint32_t doc_len, int64_t now_ms, uint32_t rnd_ptr,
                     uint32_t rnd_len, uint32_t out_ptr, uint32_t out_cap) {
  return Operation(false, handle, doc_ptr, doc_len, now_ms, rnd_ptr, rnd_len, out_ptr, out_cap);
}
