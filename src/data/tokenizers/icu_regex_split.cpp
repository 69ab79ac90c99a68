// Any other Split regex of a tokenizer.json, on ICU's regex engine over the UTF-8 text
// (UText: match offsets are byte offsets). One difference from Oniguruma / fancy-regex
// is patched: ICU's \s is [\t\n\f\r\p{Z}] (no U+000B, no U+0085) while theirs is the
// White_Space property, so \s and \S become \p{White_Space} and \P{White_Space}.
#include <unicode/uregex.h>
#include <unicode/utext.h>

#include <memory>

#include "pretokenizer.h"
#include "tessera/base/error.h"

namespace tessera::data::bpe {

namespace {

std::string with_unicode_white_space(const std::string& regex) {
  std::string out;
  for (size_t i = 0; i < regex.size(); ++i) {
    if (regex[i] == '\\' && i + 1 < regex.size()) {
      const char next = regex[++i];
      if (next == 's')
        out += "\\p{White_Space}";
      else if (next == 'S')
        out += "\\P{White_Space}";
      else
        out += {'\\', next};
    } else {
      out.push_back(regex[i]);
    }
  }
  return out;
}

struct RegexCloser {
  void operator()(URegularExpression* regex) const { uregex_close(regex); }
};
using RegexPtr = std::unique_ptr<URegularExpression, RegexCloser>;

class IcuSplit final : public SplitPattern {
 public:
  IcuSplit(const std::string& regex, const std::string& where) : pattern_(regex) {
    UErrorCode status = U_ZERO_ERROR;
    UParseError parse{};
    const std::string icu_regex = with_unicode_white_space(regex);
    UText* text = utext_openUTF8(nullptr, icu_regex.data(), static_cast<int64_t>(icu_regex.size()), &status);
    compiled_.reset(uregex_openUText(text, 0, &parse, &status));
    utext_close(text);
    if (U_FAILURE(status))
      fail<IOError>("{}: ICU cannot compile the regex '{}' ({} at offset {})", where, regex, u_errorName(status),
                    parse.offset);
  }

  void split(std::string_view text, std::vector<std::string_view>& pieces) const override {
    // A compiled URegularExpression holds match state: each call matches on its own clone.
    UErrorCode status = U_ZERO_ERROR;
    RegexPtr regex(uregex_clone(compiled_.get(), &status));
    UText* utext = utext_openUTF8(nullptr, text.data(), static_cast<int64_t>(text.size()), &status);
    uregex_setUText(regex.get(), utext, &status);
    size_t done = 0;
    while (U_SUCCESS(status) && uregex_findNext(regex.get(), &status)) {
      const auto start = static_cast<size_t>(uregex_start64(regex.get(), 0, &status));
      const auto end = static_cast<size_t>(uregex_end64(regex.get(), 0, &status));
      if (end == start) continue;  // empty matches cut nothing
      if (start > done) pieces.emplace_back(text.data() + done, start - done);
      pieces.emplace_back(text.data() + start, end - start);
      done = end;
    }
    utext_close(utext);
    if (U_FAILURE(status))
      fail<ValueError>("pre-tokenizer regex '{}': ICU matching failed ({})", pattern_, u_errorName(status));
    if (done < text.size()) pieces.emplace_back(text.data() + done, text.size() - done);
  }
  const std::string& pattern() const override { return pattern_; }

 private:
  std::string pattern_;
  RegexPtr compiled_;
};

}  // namespace

std::shared_ptr<const SplitPattern> make_icu_split(const std::string& regex, const std::string& where) {
  return std::make_shared<IcuSplit>(regex, where);
}

}  // namespace tessera::data::bpe
