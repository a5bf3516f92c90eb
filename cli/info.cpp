// `qkv info`: what this build of qkv is: version, the attention kernels this CPU runs, and whether it was built with
// MPI (data parallelism and ring attention across processes) and which MPI library.
#include <cstdio>
#include <string>

#include "commands.h"
#include "qkv/dist/comm.h"
#include "qkv/kernels/attention_flash.h"
#include "qkv/kernels/lowp.h"

#ifndef QKV_VERSION
#define QKV_VERSION "unknown"
#endif

namespace qkv::cli {

void add_info(CLI::App& app) {
  auto* cmd = app.add_subcommand("info", "Version, CPU kernels and MPI support of this build");
  cmd->callback([]() {
    std::printf("qkv %s\n", QKV_VERSION);
    std::printf("attention kernels: %s\n", kernels::flash_isa_name());
    std::printf("bf16: %s\n", kernels::lowp_paths().bf16);
    std::printf("int8: %s\n", kernels::lowp_paths().int8);
    if (dist::built_with_mpi()) {
      std::printf("mpi: yes (%s)\n", dist::mpi_library_version().c_str());
    } else {
      std::printf("mpi: no (built without MPI: one process only; install libopenmpi-dev and rebuild)\n");
    }
  });
}

}  // namespace qkv::cli
