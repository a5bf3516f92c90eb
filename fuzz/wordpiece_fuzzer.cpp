// libFuzzer target for the WordPiece tokenizer on arbitrary bytes. The first byte picks the mode:
//   even: the rest is text for a fixed small vocabulary: tokenize/encode either work or throw
//         std::invalid_argument "[wordpiece] ..." (invalid UTF-8); encoded ids are in range, start with [CLS], end
//         with [SEP], and respect max_length;
//   odd:  the rest is a vocab.txt body (one token per line): the tokenizer is built or refused with
//         "[wordpiece] ...", and a built one tokenizes its own tokens.
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_check.h"
#include "qkv/models/wordpiece.h"

namespace {

const qkv::models::WordPieceTokenizer& fixed_tokenizer() {
  static const qkv::models::WordPieceTokenizer tok(std::vector<std::string>{
      "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "b", "c", "the", "un", "##a", "##b", "##ing", "##s", "!",
      ",", ".", "\xc3\xa9", "\xe4\xb8\xad", "##\xc3\xa9", "play", "##ed", "x"});
  return tok;
}

void check_ids(const qkv::models::WordPieceTokenizer& tok, const std::vector<int64_t>& ids, int64_t max_length) {
  FUZZ_CHECK(ids.size() >= 2 && static_cast<int64_t>(ids.size()) <= max_length);
  FUZZ_CHECK(ids.front() == tok.cls_id() && ids.back() == tok.sep_id());
  for (int64_t id : ids) FUZZ_CHECK(id >= 0 && id < tok.vocab_size());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  if ((data[0] & 1) == 0) {
    const auto& tok = fixed_tokenizer();
    const int64_t max_length = 2 + (data[0] >> 1) % 16;
    try {
      const std::vector<std::string> pieces = tok.tokenize(rest);
      for (const auto& p : pieces) FUZZ_CHECK(!p.empty() && tok.token_to_id(p) >= 0);
      const std::vector<int64_t> ids = tok.encode(rest, max_length);
      check_ids(tok, ids, max_length);
      FUZZ_CHECK(ids.size() == std::min<size_t>(pieces.size(), static_cast<size_t>(max_length - 2)) + 2);
      (void)tok.normalize(rest);
    } catch (const std::invalid_argument& e) {
      FUZZ_CHECK(fuzz_message_starts_with(e.what(), "[wordpiece] "));
    }
    return 0;
  }
  std::vector<std::string> vocab;
  size_t start = 0;
  while (start <= rest.size()) {
    size_t nl = rest.find('\n', start);
    if (nl == std::string_view::npos) nl = rest.size();
    vocab.emplace_back(rest.substr(start, nl - start));
    start = nl + 1;
  }
  for (const char* special : {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"}) vocab.emplace_back(special);
  try {
    const qkv::models::WordPieceTokenizer tok(vocab);
    for (const auto& t : vocab) {
      try {
        check_ids(tok, tok.encode(t, 8), 8);
      } catch (const std::invalid_argument& e) {
        FUZZ_CHECK(fuzz_message_starts_with(e.what(), "[wordpiece] "));
      }
    }
  } catch (const std::invalid_argument& e) {
    FUZZ_CHECK(fuzz_message_starts_with(e.what(), "[wordpiece] "));
  }
  return 0;
}
