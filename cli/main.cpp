// The `qkv` command: dispatches to one subcommand per file. Errors become one line on stderr and exit code 2,
// a failed write to stdout included (checked when the command ends).
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>

#include "commands.h"
#include "qkv/parallel/comm.h"
#include "run_common.h"

namespace {

// Output that never reached its file (a full disk, a closed pipe) is an error, not a silent success.
int close_stdout(int rc) {
  if (rc != 0) {  // the failure was reported already (a failed write to stdout included): one line only
    std::fclose(stdout);
    return rc;
  }
  errno = 0;
  const bool failed = std::fflush(stdout) != 0 || std::ferror(stdout) != 0;
  const int flush_errno = errno;
  const bool close_failed = std::fclose(stdout) != 0;
  if (failed || close_failed) {
    std::fprintf(stderr, "qkv: error: cannot write to standard output: %s\n",
                 std::strerror(failed && flush_errno ? flush_errno : errno ? errno : EIO));
    return 2;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int rc;
  try {
    rc = qkv::cli::run(argc, argv);
  } catch (const qkv::cli::ExitStatus& e) {
    rc = e.code;  // the command printed its message
  } catch (const std::exception& e) {
    std::fprintf(stderr, "qkv: error: %s\n", e.what());
    rc = 2;
  }
  // One of several mpirun ranks that failed: end them all rather than leave them waiting for this one.
  if (rc != 0 && rc != 130 && rc != 143)
    if (qkv::parallel::Communicator* world = qkv::parallel::Communicator::started()) world->abort_all(rc);
  return close_stdout(rc);
}
