// Subcommand table of the `qkv` command (CLI11). Usage errors print one line and exit non-zero.
#include "commands.h"

#include <cstdio>

namespace qkv::cli {

int run(int argc, char** argv) {
  CLI::App app{"qkv: attention from Seq2Seq to self-attention"};
  app.require_subcommand(1);
  add_demo(app);
  add_run_layer(app);
  add_embed(app);
  add_search(app);
  add_train(app);
  add_eval(app);
  add_translate(app);
  add_experiment(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "qkv: error: %s\n", e.what());
    return 2;
  }
  return 0;
}

}  // namespace qkv::cli
