#include "pretokenizer.h"

#include <utility>

namespace tessera::data::bpe {

PreTokenizer::PreTokenizer(std::vector<PreTokenizerStep> steps) : steps_(std::move(steps)) {
  for (const PreTokenizerStep& step : steps_)
    if (step.split) {
      cut_pattern_ = step.split->known();
      break;
    }
}

size_t PreTokenizer::next_safe_cut(std::string_view text, size_t from) const {
  return bpe::next_safe_cut(cut_pattern_, text, from);
}

void PreTokenizer::pieces(std::string_view text, bool segment_start, std::deque<std::string>& arena,
                          std::vector<std::string_view>& out) const {
  if (text.empty()) return;
  // The common case: one Split, straight into `out`.
  if (steps_.size() == 1 && steps_[0].split) {
    steps_[0].split->split(text, out);
    return;
  }
  std::vector<std::string_view> current{text}, next;
  bool split_done = false;
  for (const PreTokenizerStep& step : steps_) {
    next.clear();
    if (step.split) {
      for (const std::string_view piece : current) step.split->split(piece, next);
      split_done = true;
    } else if (step.prefix_space) {
      // Before any Split the prefix goes before the segment only (not before a chunk of it).
      for (const std::string_view piece : current) {
        if ((split_done || segment_start) && piece.front() != ' ') {
          arena.push_back(" " + std::string(piece));
          next.emplace_back(arena.back());
        } else {
          next.push_back(piece);
        }
      }
    }
    std::swap(current, next);
  }
  out.insert(out.end(), current.begin(), current.end());
}

std::string PreTokenizer::description() const {
  std::string text;
  for (const PreTokenizerStep& step : steps_) {
    if (step.split)
      text += "split:" + step.split->pattern() + '\n';
    else if (step.prefix_space)
      text += "prefix_space\n";
  }
  return text;
}

}  // namespace tessera::data::bpe
