// Entry point of the `chstate` tool: hands argv, the environment and the
// standard streams to chstate::cli::Main (hosts/native/cli.h).
#include <cstring>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "hosts/native/cli.h"

extern char** environ;

namespace {

// Overwrites, in the process's own argument memory, a password given on the
// command line (--password VALUE, --password=VALUE, or the user:PASSWORD@ of
// a URI), once it has been copied: `chstate lock` can run for hours, and
// /proc/<pid>/cmdline (`ps`) shows this memory to every local user. It was
// visible from exec until here, which is why --help discourages the flag.
void Blank(char* from, char* to) {
  for (char* c = from; c < to; ++c) *c = '*';
}

void HideUriPassword(char* arg) {
  char* scheme = std::strstr(arg, "://");
  if (scheme == nullptr) return;
  char* userinfo = scheme + 3;
  char* end = userinfo + std::strcspn(userinfo, "@/?#");
  if (*end != '@') return;
  char* colon = static_cast<char*>(std::memchr(userinfo, ':', end - userinfo));
  if (colon != nullptr) Blank(colon + 1, end);
}

void HidePasswords(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--") == 0) break;  // the locked command's own arguments
    if (std::strcmp(argv[i], "--password") == 0 && i + 1 < argc) {
      Blank(argv[i + 1], argv[i + 1] + std::strlen(argv[i + 1]));
    } else if (std::strncmp(argv[i], "--password=", 11) == 0) {
      Blank(argv[i] + 11, argv[i] + std::strlen(argv[i]));
    } else {
      HideUriPassword(argv[i]);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  HidePasswords(argc, argv);
  std::map<std::string, std::string> env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    std::string entry(*e);
    const size_t eq = entry.find('=');
    if (eq == std::string::npos) continue;
    env.emplace(entry.substr(0, eq), entry.substr(eq + 1));
  }
  return chstate::cli::Main(args, env, std::cin, std::cout, std::cerr);
}
