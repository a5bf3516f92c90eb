// Subcommand table of the `qkv` command (CLI11). Usage errors print one line and exit non-zero.
#include "commands.h"

#include <cstdio>
#include <regex>
#include <string>

#ifndef QKV_VERSION
#define QKV_VERSION "unknown"
#endif

namespace qkv::cli {
namespace {

// CLI11's own wording of two mistakes, in qkv's one-line style naming the flag: an option given twice
// ("--lr: At Most 1 required but received 2") and a value of the wrong type ("Could not convert: --lr = abc").
std::string parse_message(const CLI::App& app, const CLI::ParseError& e) {
  const std::string what = e.what();
  std::smatch m;
  static const std::regex at_most(R"(^(\S+): At Most (\d+) required but received (\d+)$)");
  static const std::regex convert(R"(^Could not convert: (\S+) = (.*)$)");
  if (std::regex_match(what, m, at_most))
    return m[1].str() + " was given " + m[3].str() + " values; it takes " +
           (m[2].str() == "1" ? std::string("one (give it once)") : "at most " + m[2].str());
  if (std::regex_match(what, m, convert)) {
    std::string type;
    for (const CLI::App* sub : app.get_subcommands())
      if (const CLI::Option* o = sub->get_option_no_throw(m[1].str())) type = o->get_type_name();
    const std::string want = type == "INT"     ? "an integer"
                             : type == "UINT"  ? "a non-negative integer"
                             : type == "FLOAT" ? "a number"
                                               : type.empty() ? "a value of its type" : type;
    return m[1].str() + ": '" + m[2].str() + "' is not " + want;
  }
  return what;
}

}  // namespace

int run(int argc, char** argv) {
  CLI::App app{"qkv: attention from Seq2Seq to self-attention"};
  app.require_subcommand(1);
  add_demo(app);
  add_run_layer(app);
  add_embed(app);
  add_generate(app);
  add_chat(app);
  add_search(app);
  add_train(app);
  add_eval(app);
  add_translate(app);
  add_experiment(app);
  add_viz(app);
  add_serve(app);
  add_info(app);
  app.set_version_flag("--version", "qkv " QKV_VERSION);
  std::string names;
  bool known = false;
  const std::string first = argc >= 2 ? argv[1] : "";
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) {
    names += (names.empty() ? "" : ", ") + sub->get_name();
    known |= sub->check_name(first);
  }
  if (argc < 2) {
    std::fprintf(stderr, "qkv: error: a subcommand is required (one of: %s; see qkv --help)\n", names.c_str());
    return 2;
  }
  // An unknown first word is named, rather than reported as a missing subcommand.
  if (!first.empty() && first[0] != '-' && !known) {
    std::fprintf(stderr, "qkv: error: unknown subcommand '%s' (one of: %s)\n", first.c_str(), names.c_str());
    return 2;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "qkv: error: %s\n", parse_message(app, e).c_str());
    return 2;
  }
  return 0;
}

}  // namespace qkv::cli
