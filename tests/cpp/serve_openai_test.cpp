// The OpenAI protocol layer without a model: stop strings over text pieces (held back, cut, across pieces), request
// options checked field by field, chat messages normalised, error objects and finish reasons.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "qkv/serve/openai.h"

namespace qkv::serve {
namespace {

json::Value body(const std::string& text) { return parse_body(text); }

// Pushes the pieces one by one and returns everything released (finish() included unless stopped).
std::string run_stops(const std::vector<std::string>& stops, const std::vector<std::string>& pieces,
                      bool* stopped = nullptr, std::vector<std::string>* released = nullptr) {
  StopText s(stops);
  std::string out;
  for (const std::string& p : pieces) {
    const std::string r = s.push(p);
    if (released) released->push_back(r);
    out += r;
  }
  out += s.finish();
  if (stopped) *stopped = s.stopped();
  return out;
}

TEST(StopText, NoStopsReleasesEverythingAtOnce) {
  std::vector<std::string> released;
  EXPECT_EQ(run_stops({}, {"Hel", "lo"}, nullptr, &released), "Hello");
  EXPECT_EQ(released, (std::vector<std::string>{"Hel", "lo"}));
}

TEST(StopText, CutBeforeTheStopWithinOnePiece) {
  bool stopped = false;
  EXPECT_EQ(run_stops({"\n\n"}, {"one\n\ntwo"}, &stopped), "one");
  EXPECT_TRUE(stopped);
}

TEST(StopText, StopAcrossPiecesIsNeverReleased) {
  bool stopped = false;
  std::vector<std::string> released;
  EXPECT_EQ(run_stops({"STOP"}, {"ab S", "T", "OP cd"}, &stopped, &released), "ab ");
  EXPECT_TRUE(stopped);
  // "S" and "ST" could begin the stop: held back, never streamed.
  EXPECT_EQ(released, (std::vector<std::string>{"ab ", "", ""}));
}

TEST(StopText, HeldBackPrefixIsReleasedWhenItCannotBeAStop) {
  std::vector<std::string> released;
  bool stopped = true;
  EXPECT_EQ(run_stops({"STOP"}, {"ab ST", "x"}, &stopped, &released), "ab STx");
  EXPECT_FALSE(stopped);
  EXPECT_EQ(released, (std::vector<std::string>{"ab ", "STx"}));
}

TEST(StopText, TailThatMayBeginAStopIsReleasedAtTheEnd) {
  bool stopped = true;
  EXPECT_EQ(run_stops({"STOP"}, {"ab", "STO"}, &stopped), "abSTO");
  EXPECT_FALSE(stopped);
}

TEST(StopText, EarliestOfSeveralStopsWins) {
  EXPECT_EQ(run_stops({"world", "lo"}, {"hello world"}), "hel");
  EXPECT_EQ(run_stops({"b", "abc"}, {"xa", "bc"}), "x");  // "abc" begins before "b"
}

TEST(StopText, StopAtTheVeryStartGivesNothing) {
  bool stopped = false;
  EXPECT_EQ(run_stops({"A"}, {"A", "B"}, &stopped), "");
  EXPECT_TRUE(stopped);
}

TEST(StopText, OverlappingPrefixHoldsTheLongestTail) {
  // "aab" inside "aaab": the tail "aa" is held, then "aab" completes one character later.
  EXPECT_EQ(run_stops({"aab"}, {"a", "a", "a", "b"}), "a");
}

TEST(ParseBody, NotJsonOrNotAnObjectIs400) {
  for (const char* text : {"{", "[1]", "\"x\"", "", "{\"a\":1,}"}) {
    try {
      parse_body(text);
      FAIL() << text;
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status(), 400);
      EXPECT_EQ(e.type(), "invalid_request_error");
    }
  }
}

void expect_refused(const std::string& text, const std::string& words, Endpoint endpoint = Endpoint::kChat) {
  try {
    parse_options(body(text), endpoint);
    FAIL() << text << " was accepted";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status(), 400) << text;
    EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
  }
}

TEST(ParseOptions, DefaultsAreOpenAIs) {
  const CompletionOptions o = parse_options(body("{}"), Endpoint::kChat);
  EXPECT_EQ(o.max_tokens, -1);
  EXPECT_EQ(o.n, 1);
  EXPECT_FALSE(o.stream);
  EXPECT_EQ(o.logprobs, -1);
  EXPECT_FLOAT_EQ(o.sampling.temperature, 1.0f);
  EXPECT_TRUE(o.stop.empty());
}

TEST(ParseOptions, EveryFieldIsRead) {
  const CompletionOptions o = parse_options(
      body(R"({"max_tokens": 9, "max_completion_tokens": 7, "temperature": 0, "top_p": 0.5, "top_k": 3, "seed": 11,
               "stop": ["a", "b"], "n": 2, "stream": true, "stream_options": {"include_usage": true},
               "logprobs": true, "top_logprobs": 4, "model": "anything", "user": "ignored"})"),
      Endpoint::kChat);
  EXPECT_EQ(o.max_tokens, 7);
  EXPECT_EQ(o.sampling.temperature, 0.0f);
  EXPECT_FLOAT_EQ(o.sampling.top_p, 0.5f);
  EXPECT_EQ(o.sampling.top_k, 3);
  EXPECT_EQ(o.sampling.seed, 11u);
  EXPECT_EQ(o.stop, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(o.n, 2);
  EXPECT_TRUE(o.stream && o.include_usage);
  EXPECT_EQ(o.logprobs, 4);
  EXPECT_EQ(parse_options(body(R"({"stop": "x", "logprobs": true})"), Endpoint::kChat).logprobs, 0);
  EXPECT_EQ(parse_options(body(R"({"stop": "x"})"), Endpoint::kChat).stop, std::vector<std::string>{"x"});
  EXPECT_EQ(parse_options(body(R"({"logprobs": 3})"), Endpoint::kCompletion).logprobs, 3);
  EXPECT_EQ(parse_options(body(R"({"max_tokens": 4.0})"), Endpoint::kChat).max_tokens, 4);
  EXPECT_EQ(parse_options(body(R"({"max_tokens": null})"), Endpoint::kChat).max_tokens, -1);
}

TEST(ParseOptions, WrongTypesAndRangesAreRefusedNamingTheField) {
  expect_refused(R"({"max_tokens": "5"})", "'max_tokens' must be an integer, got a string");
  expect_refused(R"({"max_tokens": 2.5})", "'max_tokens' must be an integer");
  expect_refused(R"({"temperature": -1})", "'temperature' must be >= 0");
  expect_refused(R"({"temperature": "hot"})", "'temperature' must be a number");
  expect_refused(R"({"top_p": 0})", "'top_p' must be in (0, 1]");
  expect_refused(R"({"top_p": 1.5})", "'top_p' must be in (0, 1]");
  expect_refused(R"({"n": 0})", "'n' must be in [1, 8]");
  expect_refused(R"({"n": 100})", "'n' must be in [1, 8]");
  expect_refused(R"({"stop": 5})", "'stop' must be a string or a list of strings");
  expect_refused(R"({"stop": ["a", 1]})", "'stop' must be a string or a list of strings");
  expect_refused(R"({"stop": [""]})", "'stop' holds an empty string");
  expect_refused(R"({"stream": "yes"})", "'stream' must be a boolean");
  expect_refused(R"({"stream_options": {"include_usage": true}})", "only allowed with 'stream': true");
  expect_refused(R"({"top_logprobs": 2})", "'top_logprobs' needs 'logprobs': true");
  expect_refused(R"({"logprobs": true, "top_logprobs": 21})", "'top_logprobs' must be in [0, 20]");
  expect_refused(R"({"logprobs": 2})", "'logprobs' must be a boolean");
  expect_refused(R"({"logprobs": true})", "'logprobs' must be an integer", Endpoint::kCompletion);
  expect_refused(R"({"frequency_penalty": 0.5})", "'frequency_penalty' other than 0 is not supported");
  expect_refused(R"({"tools": [{"type": "function"}]})", "'tools' (tool calls) is not supported");
  expect_refused(R"({"response_format": {"type": "json_object"}})", "'response_format'");
  expect_refused(R"({"echo": true})", "'echo' is not supported", Endpoint::kCompletion);
}

TEST(ChatMessages, NormalisedForTheTemplate) {
  const json::Value m = chat_messages(body(R"({"messages": [
      {"role": "developer", "content": "Be brief."},
      {"role": "user", "content": [{"type": "text", "text": "Hi "}, {"type": "text", "text": "there"}]},
      {"role": "assistant", "content": null}]})"));
  EXPECT_EQ(m.dump(0), json::Value::parse(R"([{"role":"system","content":"Be brief."},
      {"role":"user","content":"Hi there"},{"role":"assistant","content":""}])", "t").dump(0));
}

TEST(ChatMessages, MistakesAre400NamingTheMessage) {
  auto refused = [](const std::string& text, const std::string& words) {
    try {
      chat_messages(body(text));
      FAIL() << text;
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status(), 400);
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  refused("{}", "'messages' is required");
  refused(R"({"messages": {}})", "'messages' must be a list");
  refused(R"({"messages": []})", "'messages' is empty");
  refused(R"({"messages": [1]})", "'messages[0]' must be an object");
  refused(R"({"messages": [{"role": "wizard", "content": "x"}]})", "'messages[0].role' is 'wizard'");
  refused(R"({"messages": [{"content": "x"}]})", "'messages[0].role' must be a string");
  refused(R"({"messages": [{"role": "user"}]})", "'messages[0].content' must be a string");
  refused(R"({"messages": [{"role": "user", "content": 3}]})", "'messages[0].content' must be a string");
  refused(R"({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})", "reads text only");
}

TEST(ErrorBody, CarriesCodeMessageTypeAndExtras) {
  const ApiError e(400, "exceed_context_size_error", "too long",
                   json::Value::object().set("n_prompt_tokens", 9).set("n_ctx", 8));
  EXPECT_EQ(error_body(e).dump(0),
            body(R"({"error":{"code":400,"message":"too long","type":"exceed_context_size_error","n_prompt_tokens":9,)"
                 R"("n_ctx":8}})").dump(0));
}

TEST(FinishReason, OpenAIsNames) {
  EXPECT_STREQ(finish_reason(decode::FinishReason::kStop, false), "stop");
  EXPECT_STREQ(finish_reason(decode::FinishReason::kLength, false), "length");
  EXPECT_STREQ(finish_reason(decode::FinishReason::kContext, false), "length");
  EXPECT_STREQ(finish_reason(decode::FinishReason::kCancelled, true), "stop");
  EXPECT_EQ(finish_reason(decode::FinishReason::kCancelled, false), nullptr);
}

TEST(Usage, TotalIsTheSum) {
  EXPECT_EQ(usage(7, 5).dump(0), body(R"({"prompt_tokens":7,"completion_tokens":5,"total_tokens":12})").dump(0));
}

}  // namespace
}  // namespace qkv::serve
