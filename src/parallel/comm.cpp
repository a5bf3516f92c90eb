// The process group over Open MPI (QKV_HAVE_MPI), or the one process alone. See qkv/parallel/comm.h.
#include "qkv/parallel/comm.h"

#include <climits>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "qkv/core/error.h"

#ifdef QKV_HAVE_MPI
#define OMPI_SKIP_MPICXX 1  // the C API only: no deprecated C++ bindings to link
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#endif

namespace qkv::parallel {

struct RequestState {
#ifdef QKV_HAVE_MPI
  MPI_Request request = MPI_REQUEST_NULL;
#endif
  bool pending = false;
};

Request::Request() = default;
Request::Request(Request&&) noexcept = default;
Request& Request::operator=(Request&& other) noexcept {
  if (this != &other) {
    Request dropped(std::move(*this));  // waits for a pending request of ours
    state_ = std::move(other.state_);
  }
  return *this;
}
Request::~Request() {
#ifdef QKV_HAVE_MPI
  if (state_ && state_->pending) MPI_Wait(&state_->request, MPI_STATUS_IGNORE);
#endif
}
bool Request::pending() const { return state_ && state_->pending; }

bool built_with_mpi() {
#ifdef QKV_HAVE_MPI
  return true;
#else
  return false;
#endif
}

std::string mpi_library_version() {
#ifdef QKV_HAVE_MPI
  char text[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0;
  if (MPI_Get_library_version(text, &len) != MPI_SUCCESS) return "MPI (version unknown)";
  std::string s(text, static_cast<size_t>(len));
  const size_t cut = s.find_first_of(",\n");
  return cut == std::string::npos ? s : s.substr(0, cut);
#else
  return "";
#endif
}

namespace {

void check_count(int64_t n, const char* op) {
  QKV_CHECK_ARG(n >= 0 && n <= INT_MAX, "[dist.", op, "] count ", n, " must be in [0, ", INT_MAX, "]");
}

#ifdef QKV_HAVE_MPI
void check_mpi(int rc, const char* op) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  throw std::runtime_error(detail::concat("[dist.", op, "] MPI error: ", std::string(text, static_cast<size_t>(len))));
}

// A launcher's environment: Open MPI's mpirun, or a PMI/PMIx one (srun, hydra).
bool started_by_launcher() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE"})
    if (std::getenv(name) != nullptr) return true;
  return false;
}
#endif

}  // namespace

namespace {
Communicator* g_world = nullptr;  // set by world()
}  // namespace

Communicator::Communicator() {
#ifdef QKV_HAVE_MPI
  int initialised = 0;
  MPI_Initialized(&initialised);
  if (!initialised && !started_by_launcher()) return;  // a plain process: the group of one, MPI untouched
  if (!initialised) {
    int provided = 0;
    check_mpi(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided), "init");
    finalize_ = true;
  }
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  check_mpi(MPI_Comm_rank(MPI_COMM_WORLD, &rank_), "init");
  check_mpi(MPI_Comm_size(MPI_COMM_WORLD, &size_), "init");
  uses_mpi_ = true;
#else
  // mpirun started several copies of a build that cannot talk to each other: each would run alone, all writing the
  // same files. Refused rather than done N times.
  const char* launched = std::getenv("OMPI_COMM_WORLD_SIZE");
  if (launched == nullptr) launched = std::getenv("PMI_SIZE");
  QKV_CHECK_RUNTIME(launched == nullptr || std::atoi(launched) <= 1, "[dist.init] started as one of ", launched,
                    " ranks, but this qkv was built without MPI (install libopenmpi-dev and rebuild)");
#endif
}

Communicator::~Communicator() {
  g_world = nullptr;
#ifdef QKV_HAVE_MPI
  int finalised = 0;
  MPI_Finalized(&finalised);
  if (finalize_ && !finalised) MPI_Finalize();
#endif
}

Communicator& Communicator::world() {
  static Communicator comm;
  g_world = &comm;
  return comm;
}

Communicator* Communicator::started() { return g_world; }

void Communicator::abort_all(int code) {
#ifdef QKV_HAVE_MPI
  if (uses_mpi_ && size_ > 1) MPI_Abort(MPI_COMM_WORLD, code);
#endif
  (void)code;
}

void Communicator::barrier() {
#ifdef QKV_HAVE_MPI
  if (uses_mpi_) check_mpi(MPI_Barrier(MPI_COMM_WORLD), "barrier");
#endif
}

void Communicator::broadcast_bytes(void* data, int64_t n, int root) {
  check_count(n, "broadcast");
  QKV_CHECK_ARG(root >= 0 && root < size_, "[dist.broadcast] root ", root, " is not a rank of a group of ", size_);
  QKV_CHECK_ARG(n == 0 || data != nullptr, "[dist.broadcast] null buffer of ", n, " bytes");
  if (rank_ == root) bytes_sent_ += n;
#ifdef QKV_HAVE_MPI
  if (uses_mpi_) check_mpi(MPI_Bcast(data, static_cast<int>(n), MPI_BYTE, root, MPI_COMM_WORLD), "broadcast");
#endif
}

void Communicator::broadcast(float* data, int64_t n, int root) {
  check_count(n, "broadcast");
  QKV_CHECK_ARG(root >= 0 && root < size_, "[dist.broadcast] root ", root, " is not a rank of a group of ", size_);
  QKV_CHECK_ARG(n == 0 || data != nullptr, "[dist.broadcast] null buffer of ", n, " floats");
  if (rank_ == root) bytes_sent_ += n * static_cast<int64_t>(sizeof(float));
#ifdef QKV_HAVE_MPI
  if (uses_mpi_) check_mpi(MPI_Bcast(data, static_cast<int>(n), MPI_FLOAT, root, MPI_COMM_WORLD), "broadcast");
#endif
}

void Communicator::allreduce(float* data, int64_t n, bool max) {
  const char* op = max ? "allreduce_max" : "allreduce_sum";
  check_count(n, op);
  QKV_CHECK_ARG(n == 0 || data != nullptr, "[dist.", op, "] null buffer of ", n, " floats");
  bytes_sent_ += n * static_cast<int64_t>(sizeof(float));
#ifdef QKV_HAVE_MPI
  if (uses_mpi_)
    check_mpi(MPI_Allreduce(MPI_IN_PLACE, data, static_cast<int>(n), MPI_FLOAT, max ? MPI_MAX : MPI_SUM,
                            MPI_COMM_WORLD),
              op);
#endif
}

// The arguments of one non-blocking send or receive: the peer is another rank, the tag is valid, the buffer exists.
static void check_point_to_point(const char* op, const char* role, int peer, int rank, int size, int tag,
                                 int64_t n, const void* data) {
  check_count(n, op);
  QKV_CHECK_ARG(peer >= 0 && peer < size && peer != rank, "[dist.", op, "] ", role, " ", peer,
                " is not another rank of a group of ", size, " (this is rank ", rank, ")");
  QKV_CHECK_ARG(tag >= 0, "[dist.", op, "] tag ", tag, " must be >= 0");
  QKV_CHECK_ARG(n == 0 || data != nullptr, "[dist.", op, "] null buffer of ", n, " floats");
}

Request Communicator::isend(const float* data, int64_t n, int dest, int tag) {
  check_point_to_point("isend", "destination", dest, rank_, size_, tag, n, data);
  Request r;
  r.state_ = std::make_unique<RequestState>();
  bytes_sent_ += n * static_cast<int64_t>(sizeof(float));
#ifdef QKV_HAVE_MPI
  check_mpi(MPI_Isend(data, static_cast<int>(n), MPI_FLOAT, dest, tag, MPI_COMM_WORLD, &r.state_->request),
            "isend");
  r.state_->pending = true;
#endif
  return r;
}

Request Communicator::irecv(float* data, int64_t n, int source, int tag) {
  check_point_to_point("irecv", "source", source, rank_, size_, tag, n, data);
  Request r;
  r.state_ = std::make_unique<RequestState>();
#ifdef QKV_HAVE_MPI
  check_mpi(MPI_Irecv(data, static_cast<int>(n), MPI_FLOAT, source, tag, MPI_COMM_WORLD, &r.state_->request),
            "irecv");
  r.state_->pending = true;
#endif
  return r;
}

void Communicator::wait(Request& request) {
  if (!request.pending()) return;
#ifdef QKV_HAVE_MPI
  request.state_->pending = false;
  check_mpi(MPI_Wait(&request.state_->request, MPI_STATUS_IGNORE), "wait");
#endif
}

Request Communicator::iallreduce_sum(float* data, int64_t n) {
  check_count(n, "iallreduce");
  QKV_CHECK_ARG(n == 0 || data != nullptr, "[dist.iallreduce] null buffer of ", n, " floats");
  Request r;
  r.state_ = std::make_unique<RequestState>();
  bytes_sent_ += n * static_cast<int64_t>(sizeof(float));
#ifdef QKV_HAVE_MPI
  if (uses_mpi_) {
    check_mpi(MPI_Iallreduce(MPI_IN_PLACE, data, static_cast<int>(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD,
                             &r.state_->request),
              "iallreduce");
    r.state_->pending = true;
  }
#endif
  return r;
}

bool Communicator::test(Request& request) {
  if (!request.pending()) return true;
#ifdef QKV_HAVE_MPI
  int done = 0;
  const int rc = MPI_Test(&request.state_->request, &done, MPI_STATUS_IGNORE);
  if (done != 0 || rc != MPI_SUCCESS) request.state_->pending = false;  // a failed request is not waited for again
  check_mpi(rc, "test");
  return done != 0;
#else
  return true;
#endif
}

void Communicator::check_same([[maybe_unused]] uint64_t value, const std::string& what) {
  if (size_ == 1) return;
  std::vector<uint64_t> all(static_cast<size_t>(size_), 0);
  bytes_sent_ += static_cast<int64_t>(sizeof(uint64_t));
#ifdef QKV_HAVE_MPI
  check_mpi(MPI_Allgather(&value, 1, MPI_UINT64_T, all.data(), 1, MPI_UINT64_T, MPI_COMM_WORLD), "check_same");
#endif
  for (int r = 1; r < size_; ++r)
    QKV_CHECK_RUNTIME(all[static_cast<size_t>(r)] == all[0], "[dist.check_same] ", what,
                      " differs between ranks: rank ", r, " has ", all[static_cast<size_t>(r)], ", rank 0 has ",
                      all[0], " (", size_, " ranks)");
}

uint64_t hash_bytes(const void* data, size_t n, uint64_t seed) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t h = seed;
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

uint64_t hash_floats(const float* data, int64_t n, uint64_t seed) {
  QKV_CHECK_ARG(n >= 0 && (n == 0 || data != nullptr), "[dist.hash_floats] bad buffer of ", n, " floats");
  return hash_bytes(data, static_cast<size_t>(n) * sizeof(float), seed);
}

}  // namespace qkv::parallel
