// Subcommand table of the `qkv` command (CLI11).
#include "commands.h"

#include <CLI/CLI.hpp>

namespace qkv::cli {

int run(int argc, char** argv) {
  CLI::App app{"qkv: attention from Seq2Seq to self-attention"};
  app.require_subcommand(1);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  return 0;
}

}  // namespace qkv::cli
