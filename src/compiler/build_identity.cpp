// build_identity(): which build of tessera is running, for the compilation cache's
// index (compiler/compilation_cache.h). The index skips tracing, so a program traced by
// one build must never be run by another: tracing code (models, optimizers, ops'
// gradients) changes without any key part changing.
//
// Why the GNU build-id: the linker computes it from the linked output's contents, so it
// changes with any change to the code that was linked (unlike __DATE__/__TIME__ of one
// translation unit, which only changes when that file is recompiled, or git describe,
// which misses uncommitted edits and needs a reconfigure), and it costs nothing to read
// (a note in the loaded image). Without one (linked with --build-id=none), the object
// file's bytes are hashed instead.
#include <dlfcn.h>
#include <elf.h>
#include <fmt/format.h>
#include <link.h>

#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#include "tessera/base/version.h"
#include "tessera/compiler/compilation_cache.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace tessera::compiler {

namespace {

struct BuildIdSearch {
  uintptr_t address = 0;  // an address inside tessera's code
  std::string build_id;   // hex, once found
};

// dl_iterate_phdr callback: the NT_GNU_BUILD_ID note of the loaded object whose
// segments hold search->address.
int find_build_id(dl_phdr_info* info, size_t, void* data) {
  auto* search = static_cast<BuildIdSearch*>(data);
  bool holds = false;
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    const uintptr_t start = info->dlpi_addr + ph.p_vaddr;
    if (ph.p_type == PT_LOAD && search->address >= start && search->address < start + ph.p_memsz) holds = true;
  }
  if (!holds) return 0;
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    if (ph.p_type != PT_NOTE) continue;
    const auto* at = reinterpret_cast<const unsigned char*>(info->dlpi_addr + ph.p_vaddr);
    const unsigned char* end = at + ph.p_memsz;
    while (at + sizeof(ElfW(Nhdr)) <= end) {
      ElfW(Nhdr) note;
      std::memcpy(&note, at, sizeof(note));
      const unsigned char* name = at + sizeof(note);
      const unsigned char* desc = name + ((note.n_namesz + 3) & ~3u);
      if (desc + note.n_descsz > end) break;
      if (note.n_type == NT_GNU_BUILD_ID && note.n_namesz == 4 && std::memcmp(name, "GNU", 4) == 0) {
        for (uint32_t b = 0; b < note.n_descsz; ++b) search->build_id += fmt::format("{:02x}", desc[b]);
        return 1;
      }
      at = desc + ((note.n_descsz + 3) & ~3u);
    }
  }
  return 1;  // the object, without a build-id
}

std::string compute_build_identity() {
  BuildIdSearch search;
  search.address = reinterpret_cast<uintptr_t>(&build_identity);
  dl_iterate_phdr(find_build_id, &search);
  if (!search.build_id.empty()) return fmt::format("{} build-id {}", tessera::version(), search.build_id);
  Dl_info where{};
  if (dladdr(reinterpret_cast<void*>(&build_identity), &where) == 0 || where.dli_fname == nullptr) return "";
  std::ifstream in(where.dli_fname[0] != '\0' ? where.dli_fname : "/proc/self/exe", std::ios::binary);
  if (!in) return "";
  std::ostringstream bytes;
  bytes << in.rdbuf();
  const std::string content = bytes.str();
  if (content.empty()) return "";
  const XXH128_hash_t h = XXH3_128bits(content.data(), content.size());
  return fmt::format("{} xxh3 {:016x}{:016x}", tessera::version(), h.high64, h.low64);
}

}  // namespace

const std::string& build_identity() {
  static const std::string identity = compute_build_identity();
  return identity;
}

}  // namespace tessera::compiler
