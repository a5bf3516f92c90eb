// Subcommand registry of the `qkv` command: each subcommand lives in its own file and adds itself here.
#pragma once

#include <CLI/CLI.hpp>

namespace qkv::cli {

int run(int argc, char** argv);

// Each registers one subcommand on `app`; the callback runs the command and may throw.
void add_demo(CLI::App& app);
void add_run_layer(CLI::App& app);  // cli/run_layer.cpp
void add_embed(CLI::App& app);   // cli/embed.cpp
void add_search(CLI::App& app);  // cli/search.cpp

}  // namespace qkv::cli
