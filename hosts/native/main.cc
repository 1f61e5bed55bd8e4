// Entry point of the `chstate` tool: hands argv, the environment and the
// standard streams to chstate::cli::Main (hosts/native/cli.h).
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "hosts/native/cli.h"

extern char** environ;

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  std::map<std::string, std::string> env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    std::string entry(*e);
    const size_t eq = entry.find('=');
    if (eq == std::string::npos) continue;
    env.emplace(entry.substr(0, eq), entry.substr(eq + 1));
  }
  return chstate::cli::Main(args, env, std::cin, std::cout, std::cerr);
}
