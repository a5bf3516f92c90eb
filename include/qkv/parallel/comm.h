// The process group of a run (Open MPI): rank, size and the few collectives and point-to-point messages that data
// parallelism and ring attention need, over float buffers. Without MPI (a build without it, or a process that no
// MPI launcher started) the group is this one process: collectives are identities and messages to a peer throw.
// Every failure throws: std::invalid_argument for a caller mistake, std::runtime_error for an MPI error, each
// message starting "[dist.<op>]". Nothing here exits the process.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

namespace qkv::parallel {

// True when qkv was compiled against MPI (CMake option QKV_WITH_MPI).
bool built_with_mpi();
// The MPI library's own one-line version ("Open MPI v4.1.4, ..."), or "" without MPI.
std::string mpi_library_version();

struct RequestState;  // defined in src/parallel/comm.cpp

// One pending isend/irecv/iallreduce_sum. Move-only; Communicator::wait completes it. One destroyed while pending
// is waited for (its error, if any, is dropped: a destructor cannot throw).
class Request {
 public:
  Request();
  Request(Request&&) noexcept;
  Request& operator=(Request&&) noexcept;
  ~Request();
  bool pending() const;

 private:
  friend class Communicator;
  std::unique_ptr<RequestState> state_;
};

class Communicator {
 public:
  // Every process that mpirun started (MPI is initialised on the first call and finalised at exit), or a group of
  // one when qkv was built without MPI or no MPI launcher started this process.
  static Communicator& world();
  // The world when world() has been called in this process, else nullptr (never initialises MPI).
  static Communicator* started();

  int rank() const { return rank_; }
  int size() const { return size_; }
  bool uses_mpi() const { return uses_mpi_; }

  void barrier();
  // data[0, n) of rank `root` to every rank.
  void broadcast(float* data, int64_t n, int root = 0);
  void broadcast_bytes(void* data, int64_t n, int root = 0);
  // Element-wise sum / max over the ranks, in place. The sum's order is MPI's: the same on every rank (all ranks
  // hold the same bits afterwards) but not the order of a one-process sum.
  void allreduce_sum(float* data, int64_t n) { allreduce(data, n, false); }
  void allreduce_max(float* data, int64_t n) { allreduce(data, n, true); }
  // Non-blocking point-to-point; `data` must stay valid (and, for irecv, untouched) until wait(). tag >= 0.
  Request isend(const float* data, int64_t n, int dest, int tag);
  Request irecv(float* data, int64_t n, int source, int tag);
  void wait(Request& request);
  // Collective, non-blocking: the element-wise sum over the ranks of data[0, n), in place; `data` must stay valid
  // and untouched until wait(). Every rank must start the same sequence of collectives (blocking or not) in the
  // same order. MPI may run another algorithm than allreduce_sum's for it, so the sum's bits may differ from
  // allreduce_sum's, but they are the same on every rank. A group of one: completes at once (data unchanged).
  Request iallreduce_sum(float* data, int64_t n);
  // Drives MPI's progress on `request` (MPI_Test) and says whether it has completed (true for a request that is
  // not pending). A completed request needs no wait().
  bool test(Request& request);

  // Collective: every rank passes its `value` (a hash of a configuration, of parameters, ...). Throws
  // std::runtime_error on every rank, naming `what` and the first rank whose value differs from rank 0's.
  void check_same(uint64_t value, const std::string& what);

  // For a program's top level after an error: ends every rank now (MPI_Abort with `code`), so that the others do
  // not wait forever in a collective this rank will never join. Returns when the group is this process alone.
  // The library itself never calls it.
  void abort_all(int code);

  // Payload bytes this process has handed to the operations above (a broadcast counts on its root only; an
  // allreduce counts its buffer once). For the scaling model of docs/DISTRIBUTED.md.
  int64_t bytes_sent() const { return bytes_sent_; }

  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;
  ~Communicator();

 private:
  Communicator();
  void allreduce(float* data, int64_t n, bool max);
  int rank_ = 0;
  int size_ = 1;
  bool uses_mpi_ = false;
  bool finalize_ = false;  // this object initialised MPI and finalises it
  int64_t bytes_sent_ = 0;
};

// FNV-1a (64-bit) over raw bytes / over the bits of floats: equal only for bit-identical buffers.
uint64_t hash_bytes(const void* data, size_t n, uint64_t seed = 0xcbf29ce484222325ull);
uint64_t hash_floats(const float* data, int64_t n, uint64_t seed = 0xcbf29ce484222325ull);

}  // namespace qkv::parallel
