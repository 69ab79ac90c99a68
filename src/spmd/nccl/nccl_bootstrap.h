// Private to the NCCL communicator: its bootstrap, i.e. the options that choose how the
// ranks find each other (environment variables, timeouts) and the "file" bootstrap's
// id files (the ncclUniqueId written atomically to a shared directory). The exchange
// itself (NcclCommunicator::Impl::init / exchange_id, over MPI or the shared
// directory) is defined in nccl_bootstrap.cpp; see communicator_nccl.h for the contract.
#pragma once

#include <nccl.h>

#include <filesystem>
#include <initializer_list>
#include <string>
#include <vector>

namespace tessera::spmd::nccl_detail {

inline constexpr double kDefaultTimeout = 600;
inline constexpr double kDefaultBootstrapTimeout = 300;
// MPI tags on the communicator's duplicated MPI_COMM_WORLDs.
inline constexpr int kAbortTag = 7101;
inline constexpr int kIdTag = 7102;

enum class Boot { None, Mpi, File };

// The environment variable, or null when it is unset or empty.
const char* env(const char* name);

// The first of `names` that is set, as an int (ValueError when it is not one); -1 if none.
int env_int(std::initializer_list<const char*> names);

// `option` when it is >= 0, else the environment variable, else `fallback`.
double seconds_option(double option, const char* name, double fallback);

// Whether mpirun (Open MPI or a PMI launcher) started this process.
bool launched_by_mpi();

// `bytes` to `path`, atomically: readers see the whole file or none (a temporary name in
// the same directory, then rename).
void write_atomic(const std::filesystem::path& path, const std::string& bytes);

// The whole file, or false when it does not exist (yet).
bool read_file(const std::filesystem::path& path, std::string* bytes);

// An id file: magic, the size of the group it connects, the id.
std::string encode_id(const ncclUniqueId& id, int members);
ncclUniqueId decode_id(const std::string& bytes, int members, const std::filesystem::path& path);

// "nccl-world.id", "nccl-group-0_2_4.id" (a hash when the list is long).
std::string id_file_name(const std::vector<int>& group, bool world);

}  // namespace tessera::spmd::nccl_detail
