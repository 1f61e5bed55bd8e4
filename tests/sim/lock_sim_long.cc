// Long runs of the lock simulation, for closing notes and for replaying one
// schedule:
//
//   bazel run //tests/sim:lock_sim_long_opt -- --schedules 100000 --seed 1   (-c opt build)
//   bazel run //tests/sim:lock_sim_long -- --config crashes --seed 1234 --schedules 1 --trace
//
// Flags: --schedules N (per configuration, default 10000), --seed S (the
// first seed, default 1), --contenders K (fix K for every schedule; default:
// each configuration's range), --config NAME (only that one; default every
// configuration that must pass), --trace (print the trace of every failing
// schedule, or of the single schedule when N is 1), --without-defects (run
// the configuration with the production machine: a negative control's twin). Prints one summary line
// per configuration and the failing seeds; exits 1 when any schedule failed.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "tests/sim/lock_sim.h"

namespace {

[[noreturn]] void Usage(const std::string& why) {
  std::cerr << why
            << "\nusage: lock_sim_long [--schedules N] [--seed S] [--contenders K] [--config NAME] [--trace]"
               " [--without-defects]\n";
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace chstate::sim;
  int64_t schedules = 10000;
  uint64_t first_seed = 1;
  int contenders = 0;
  std::string only;
  bool trace = false;
  bool without_defects = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) Usage(a + " needs a value");
      return argv[++i];
    };
    if (a == "--schedules") {
      if (!absl::SimpleAtoi(value(), &schedules) || schedules < 1) Usage("bad --schedules");
    } else if (a == "--seed") {
      if (!absl::SimpleAtoi(value(), &first_seed)) Usage("bad --seed");
    } else if (a == "--contenders") {
      if (!absl::SimpleAtoi(value(), &contenders) || contenders < 1 || contenders > 64) Usage("bad --contenders");
    } else if (a == "--config") {
      only = value();
    } else if (a == "--trace") {
      trace = true;
    } else if (a == "--without-defects") {
      without_defects = true;
    } else {
      Usage("unknown flag " + a);
    }
  }

  std::vector<SimConfig> configs;
  for (const SimConfig& c : Configs()) {
    if (only.empty() ? !c.expect_violations : c.name == only) configs.push_back(c);
  }
  for (SimConfig& c : configs) {
    if (without_defects) c.defects = chstate::LockDefectsForTesting{};
  }
  if (configs.empty()) Usage("no configuration named " + only);

  RunOptions run;
  run.contenders = contenders;
  std::vector<Summary> rows;
  for (const SimConfig& c : configs) {
    Summary s;
    s.config = c.name;
    for (int64_t i = 0; i < schedules; ++i) {
      uint64_t seed = first_seed + static_cast<uint64_t>(i);
      ScheduleResult r = RunSchedule(c, seed, run);
      s.Add(r);
      if (!r.ok() || (trace && schedules == 1)) {
        if (trace) {
          RunOptions traced = run;
          traced.trace = true;
          std::cout << RunSchedule(c, seed, traced).Report();
        } else if (s.failed_schedules <= 3) {
          std::cout << r.Report();
        }
      }
    }
    rows.push_back(s);
    std::cout << FormatSummaries({s}) << s.HostsLine();
    if (c.python != 0) {
      std::cout << "  mixed fleet: " << s.python_overlaps << " Python-Python overlaps, " << s.orphan_overlaps
                << " with a Python holder whose row a Python row merged away, " << s.marker_merge_overlaps
                << " with a Python holder whose row chstate's marker merged away\n";
    }
    std::cout << std::flush;
  }
  std::cout << "\n" << FormatSummaries(rows);
  bool bad = false;
  for (const Summary& s : rows) {
    if (s.failed_schedules > 0) {
      bad = true;
      std::cout << s.config << ": failing seeds (first few): " << absl::StrJoin(s.failing_seeds, ", ") << "\n";
    }
  }
  return bad ? 1 : 0;
}
