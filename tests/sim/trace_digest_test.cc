// Pins what the lock does, schedule by schedule: every simulation
// configuration (tests/sim/lock_sim.h, machine and store kinds, negative
// controls included) runs a fixed list of seeds with its trace on, and each
// (configuration, seed) gets a digest of what crossed the lock's boundary:
// the requests sent (time, SQL, parameters, lease deadline), the answers
// given, the timers armed and the outcomes (with their messages). The lock's
// state names are left out, so renaming a state changes nothing here; any
// change in what a lock sends, when, or how it ends changes a digest.
//
// The digests are committed in tests/sim/trace_digests.txt. A change that is
// meant to change behaviour rewrites them (and says why in its commit):
//   bazel run //tests/sim:trace_digest_test_bin -- --write "$PWD/tests/sim/trace_digests.txt"
// A changed schedule is replayed with
//   bazel run //tests/sim:lock_sim_long -- --config NAME --seed S --schedules 1 --trace
// and --dump PATH writes every schedule's whole trace (state names and
// requests included) to one file, to diff before and after a change.
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "gtest/gtest.h"
#include "tests/sim/lock_sim.h"

namespace chstate::sim {
namespace {

// Seeds per configuration: 1..kSeeds. Every configuration runs all of them
// (about 1,600 schedules with traces, under 3 s with -c opt).
constexpr uint64_t kSeeds = 32;

constexpr char kDigestFile[] = "tests/sim/trace_digests.txt";

// FNV-1a, 64 bits: stable across builds and platforms (std::hash is not).
class Fnv {
 public:
  void Add(const std::string& s) {
    for (unsigned char ch : s) {
      h_ ^= ch;
      h_ *= 0x100000001b3ull;
    }
    // A separator that no line contains, so that lines cannot run together.
    h_ ^= 0xff;
    h_ *= 0x100000001b3ull;
  }
  uint64_t value() const { return h_; }

 private:
  uint64_t h_ = 0xcbf29ce484222325ull;
};

std::string Digest(const ScheduleResult& r) {
  Fnv trace, observed;
  for (const std::string& line : r.trace) trace.Add(line);
  for (const std::string& line : r.observed) observed.Add(line);
  return absl::StrFormat("%016x%016x %d events, %d requests and answers", trace.value(), observed.value(), r.events,
                         r.observed.size());
}

// "config seed" -> digest, for every configuration and seed.
std::map<std::string, std::string> Record() {
  std::map<std::string, std::string> out;
  RunOptions run;
  run.trace = true;
  run.state_names = false;
  for (const SimConfig& config : Configs()) {
    for (uint64_t seed = 1; seed <= kSeeds; ++seed) {
      out[absl::StrCat(config.name, " ", seed)] = Digest(RunSchedule(config, seed, run));
    }
  }
  return out;
}

std::string Format(const std::map<std::string, std::string>& digests) {
  std::string out =
      "# tests/sim/trace_digest_test.cc: one line per (configuration, seed): the digest of its observable\n"
      "# trace (requests, answers, timers, outcomes; no state names), events and requests/answers counted.\n";
  for (const auto& [key, digest] : digests) absl::StrAppend(&out, key, " ", digest, "\n");
  return out;
}

std::map<std::string, std::string> Parse(const std::string& text) {
  std::map<std::string, std::string> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    // "<config> <seed> <digest...>": configuration names contain no spaces.
    const size_t a = line.find(' ');
    const size_t b = a == std::string::npos ? a : line.find(' ', a + 1);
    if (b == std::string::npos) continue;
    out[line.substr(0, b)] = line.substr(b + 1);
  }
  return out;
}

std::string* write_to = nullptr;  // --write PATH
std::string* dump_to = nullptr;   // --dump PATH

void Dump(const std::string& path) {
  std::ofstream out(path, std::ios::binary);
  RunOptions run;
  run.trace = true;
  for (const SimConfig& config : Configs()) {
    for (uint64_t seed = 1; seed <= kSeeds; ++seed) {
      ScheduleResult r = RunSchedule(config, seed, run);
      out << r.Report();
      for (const std::string& line : r.observed) out << "    " << line << "\n";
    }
  }
}

TEST(TraceDigest, EveryConfigurationAndSeedBehavesAsRecorded) {
  if (dump_to != nullptr) Dump(*dump_to);
  const std::map<std::string, std::string> now = Record();
  if (write_to != nullptr) {
    std::ofstream out(*write_to, std::ios::binary);
    out << Format(now);
    ASSERT_TRUE(out.good()) << "could not write " << *write_to;
    std::cout << "wrote " << now.size() << " digests to " << *write_to << "\n";
    return;
  }
  std::ifstream in(kDigestFile, std::ios::binary);
  ASSERT_TRUE(in.good()) << "cannot read " << kDigestFile;
  std::stringstream text;
  text << in.rdbuf();
  const std::map<std::string, std::string> recorded = Parse(text.str());
  EXPECT_EQ(recorded.size(), now.size()) << "configurations or seeds were added or removed: record again";
  int changed = 0;
  for (const auto& [key, digest] : now) {
    auto it = recorded.find(key);
    if (it == recorded.end()) {
      ADD_FAILURE() << key << ": not recorded";
      continue;
    }
    if (it->second != digest) {
      if (++changed <= 10) {
        ADD_FAILURE() << key << ": the trace changed (recorded " << it->second << ", now " << digest
                      << "); replay: bazel run //tests/sim:lock_sim_long -- --config " << key.substr(0, key.find(' '))
                      << " --seed " << key.substr(key.find(' ') + 1) << " --schedules 1 --trace";
      }
    }
  }
  EXPECT_EQ(changed, 0) << changed << " of " << now.size() << " schedules changed";
  // The digests see what they should: every configuration sent requests.
  for (const auto& [key, digest] : now) EXPECT_EQ(digest.find(" 0 requests"), std::string::npos) << key;
}

}  // namespace
}  // namespace chstate::sim

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  std::string write, dump;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::string(argv[i]) == "--write") write = argv[++i];
    else if (std::string(argv[i]) == "--dump") dump = argv[++i];
  }
  if (!write.empty()) chstate::sim::write_to = &write;
  if (!dump.empty()) chstate::sim::dump_to = &dump;
  return RUN_ALL_TESTS();
}
