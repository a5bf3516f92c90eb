// Subcommand registry of the `qkv` command.
#pragma once

namespace qkv::cli {

int run(int argc, char** argv);

}  // namespace qkv::cli
