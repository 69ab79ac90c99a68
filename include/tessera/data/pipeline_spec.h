// What a data pipeline reads and how (data/pipeline.h): several sources mixed with
// weights, packed into rows, shuffled through a bounded buffer, prefetched by workers.
//
// In a training config:
//
//   [data]
//   packing = "documents"      # or "concat"
//   shuffle_buffer = 65536     # rows; 0 or 1: no shuffle
//   workers = 2                # prefetch threads; 0: on the training thread
//   prefetch = 4               # batches prepared ahead
//
//   [[data.mixture]]
//   path = "data/web/"         # a directory of token files (*.bin shards)
//   weight = 0.7
//
//   [[data.mixture]]
//   name = "notes"
//   path = "notes/"            # text files, tokenized when the pipeline opens
//   kind = "text"
//   weight = 0.3
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tessera::data {

struct SourceSpec {
  std::string name;  // "" : the path's file name (stem for a file)
  std::string path;  // a token file, a directory of token files, or text files/directories
  double weight = 1.0;
  // "tokens": a token file or a directory of them (every *.bin under it, in path order);
  // "text": a text file or a directory of them, each file one document, tokenized with
  // the run's tokenizer when the pipeline opens; "auto": text unless the path is a token
  // file or a directory holding *.bin files.
  std::string kind = "auto";
  // Where documents end in a token file: "eos" (after each of the tokenizer's
  // end-of-text ids), "none" (the shard is one document), or a token id ("10"). "auto":
  // eos when the tokenizer has one, else none. Text sources know their documents.
  std::string documents = "auto";
};

struct PipelineSpec {
  std::vector<SourceSpec> sources;
  // "documents": rows cut from each source's token stream, with segment ids so that
  // attention stops at document boundaries, positions restarting at every document and
  // no target across a boundary; "concat": plain windows (the documents run together).
  std::string packing = "documents";
  int64_t shuffle_buffer = 65536;  // rows held by the shuffle buffer (indices only; <= 1: no shuffle)
  int workers = 2;                 // prefetch threads (0: rows are read on the caller's thread)
  int64_t prefetch = 4;            // batches prepared ahead of the trainer (>= 1 with workers)

  // A ConfigError naming the source for a bad spec: no sources, a weight that is not a
  // finite number >= 0, weights summing to 0, an unknown kind/documents/packing.
  void validate() const;
  // A hash of everything that decides the stream (sources, weights, packing, buffer):
  // a resume refuses a checkpoint whose data position was taken on another stream.
  uint64_t fingerprint() const;
};

}  // namespace tessera::data
