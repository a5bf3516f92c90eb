// Subcommand registry of the `qkv` command: each subcommand lives in its own file and adds itself here.
#pragma once

#include <CLI/CLI.hpp>

namespace qkv::cli {

int run(int argc, char** argv);

// Each registers one subcommand on `app`; the callback runs the command and may throw.
void add_demo(CLI::App& app);
void add_run_layer(CLI::App& app);  // cli/run_layer.cpp
void add_embed(CLI::App& app);   // cli/embed.cpp
void add_generate(CLI::App& app);  // cli/generate.cpp
void add_chat(CLI::App& app);      // cli/chat.cpp
void add_search(CLI::App& app);  // cli/search.cpp
void add_train(CLI::App& app);      // cli/train.cpp
void add_eval(CLI::App& app);       // cli/eval.cpp
void add_translate(CLI::App& app);  // cli/translate.cpp
void add_experiment(CLI::App& app);  // cli/experiment.cpp
void add_viz(CLI::App& app);         // cli/viz.cpp
void add_info(CLI::App& app);        // cli/info.cpp
void add_serve(CLI::App& app);       // cli/serve.cpp (a stub that explains itself without cpp-httplib)

}  // namespace qkv::cli
