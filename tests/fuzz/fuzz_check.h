// FUZZ_CHECK: a property that must hold for every fuzz input. A failure
// prints what broke and aborts, which libFuzzer records as a crash and saves
// the input (crash-<sha1>) for replay: `<fuzzer> crash-<sha1>`.
#ifndef CHSTATE_TESTS_FUZZ_FUZZ_CHECK_H_
#define CHSTATE_TESTS_FUZZ_FUZZ_CHECK_H_

#include <cstdio>
#include <cstdlib>
#include <string>

#define FUZZ_CHECK(cond, ...)                                                       \
  do {                                                                              \
    if (!(cond)) {                                                                  \
      std::fprintf(stderr, "FUZZ_CHECK failed at %s:%d: %s\n", __FILE__, __LINE__, \
                   #cond);                                                          \
      ::chstate_fuzz::Explain(__VA_ARGS__);                                         \
      std::abort();                                                                 \
    }                                                                               \
  } while (0)

namespace chstate_fuzz {

inline void Explain() {}
template <typename T>
void Explain(const T& what) {
  const std::string s(what);
  std::fprintf(stderr, "  %s\n", s.c_str());
}

// True when every byte is printable ASCII (messages and SQL must be).
inline bool PrintableAscii(const std::string& s, bool allow_newline = false) {
  for (unsigned char c : s) {
    if (c == '\n' && allow_newline) continue;
    if (c < 0x20 || c > 0x7E) return false;
  }
  return true;
}

}  // namespace chstate_fuzz

#endif  // CHSTATE_TESTS_FUZZ_FUZZ_CHECK_H_
