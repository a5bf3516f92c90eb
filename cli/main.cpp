// The `qkv` command: dispatches to one subcommand per file. Errors become one line on stderr and exit code 2.
#include <cstdio>
#include <exception>
#include <string>

#include "commands.h"

int main(int argc, char** argv) {
  try {
    return qkv::cli::run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "qkv: error: %s\n", e.what());
    return 2;
  }
}
