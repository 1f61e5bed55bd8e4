#!/bin/sh
# The core is I/O-free: hosts pass in time, randomness and responses. This test
# fails if a core source names a clock, environment, file, socket, process or
# random-number API. Test helpers under core/testing are excluded.
set -u
dir="$(dirname "$0")"
pattern='(std::chrono|system_clock|steady_clock|high_resolution_clock|absl::Now|absl/time/clock\.h|absl::SleepFor|[^_a-z]time\(|clock_gettime|gettimeofday|getenv|setenv|environ\b|fopen|ifstream|ofstream|fstream|<fstream>|std::filesystem|<filesystem>|open\(|socket\(|connect\(|<sys/socket\.h>|<netinet|httplib|std::random_device|<random>|absl/random|rand\(|srand\(|getrandom|/dev/urandom|std::thread|<thread>|sleep\(|usleep|fork\(|exec[lv]p?\(|system\()'
# The check must be able to fail: it has to catch a known violation.
if ! printf 'auto t = std::chrono::steady_clock::now();\n' | grep -qE "$pattern"; then
  echo "purity pattern does not catch a clock read"; exit 1
fi
found=0
for f in "$dir"/*.h "$dir"/*.cc; do
  case "$f" in *_test.cc) continue ;; esac
  # Strip // comments so that prose may mention these words.
  if sed 's://.*$::' "$f" | grep -nE "$pattern" >/tmp/purity.$$ 2>/dev/null; then
    echo "$f uses an I/O, clock or randomness API:"; cat /tmp/purity.$$; found=1
  fi
done
rm -f /tmp/purity.$$
checked=$(ls "$dir"/*.cc | grep -vc _test.cc)
if [ "$checked" -lt 5 ]; then echo "expected the core sources next to this script, found $checked"; exit 1; fi
[ "$found" -eq 0 ] && echo "core is pure: $checked source files checked"
exit "$found"
