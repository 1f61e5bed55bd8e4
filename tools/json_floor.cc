// The least the JSON library (nlohmann/json, the design's choice) costs on an
// export document, whatever chstate does around it: the floor under
// `chstate import` and `chstate export` that no change in chstate can go
// below while it keeps their checks.
//
//   bazel run -c opt //tools:json_floor -- DOCUMENT [--repeat N]
//
// DOCUMENT is an export document as `chstate export` writes it (one entry a
// line). Prints one JSON line (seconds are the fastest of --repeat runs):
//
//   document_s  one SAX pass over the whole document with a handler that
//               keeps nothing: the import checks the whole document before
//               it writes a row, so it cannot take less than this plus its
//               INSERTs.
//   sides_s     one SAX pass over each non-empty side, as stored (dump()'s
//               text), with the same handler: the export checks every side
//               it reads before it writes it, so its client cannot take less
//               than this, even if the server's answer were read as it
//               arrives.
//
// tools/scale_bench.py runs it on the document its `chstate export` wrote and
// prints these beside the raw floors.
#include "tools/json_floor.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <iterator>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"

namespace {

double Seconds(std::chrono::steady_clock::time_point from) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - from).count();
}

int Usage(const char* why) {
  std::cerr << "json_floor: " << why << "\nusage: json_floor DOCUMENT [--repeat N]\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::string path;
  int repeat = 3;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--repeat" && i + 1 < argc) {
      repeat = std::max(1, std::atoi(argv[++i]));
    } else if (path.empty() && a.rfind("--", 0) != 0) {
      path = a;
    } else {
      return Usage(("unexpected argument " + a).c_str());
    }
  }
  if (path.empty()) return Usage("no document named");
  std::ifstream in(path, std::ios::binary);
  if (!in) return Usage(("cannot read " + path).c_str());
  const std::string document((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());

  // The stored sides (untimed).
  std::optional<std::vector<std::string>> sides = chstate::tools::StoredSides(document);
  if (!sides) {
    std::cerr << "json_floor: " << path << " is not an export document as `chstate export` writes it "
              << "(one entry a line); write it again with `chstate export --output FILE`\n";
    return 1;
  }
  std::size_t side_bytes = 0;
  for (const std::string& side : *sides) side_bytes += side.size();

  double document_s = 1e30;
  double sides_s = 1e30;
  for (int r = 0; r < repeat; ++r) {
    auto t = std::chrono::steady_clock::now();
    if (!chstate::tools::Pass(document)) {
      std::cerr << "json_floor: " << path << " is not valid JSON\n";
      return 1;
    }
    document_s = std::min(document_s, Seconds(t));
    t = std::chrono::steady_clock::now();
    std::size_t checked = 0;
    for (const std::string& side : *sides) checked += chstate::tools::Pass(side);
    sides_s = std::min(sides_s, Seconds(t));
    if (checked != sides->size()) {
      std::cerr << "json_floor: a side did not parse again\n";
      return 1;
    }
  }
  using json = nlohmann::json;
  std::cout << json{{"document_bytes", document.size()}, {"document_s", document_s}, {"sides", sides->size()},
                    {"side_bytes", side_bytes}, {"sides_s", sides_s}}
                   .dump()
            << "\n";
  return 0;
}
