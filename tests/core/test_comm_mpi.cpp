// The MPI communicator inside one process: what it checks before MPI is touched (the full
// conformance suite runs under mpirun, tests/comm/conformance.cpp, registered in
// tests/CMakeLists.txt for 1, 2 and 4 ranks).
#include "plexus/communicator.hpp"
#include "plexus/plugin.hpp"
#include "support/harness.hpp"

using namespace plexus;
using namespace plexus::test;

namespace {

Communicator* mpi_comm() {
  for (Communicator* c : runtime().communicators())
    if (c->name() == "mpi") return c;
  return nullptr;
}

}  // namespace

TEST_CASE("the mpi communicator takes cpu buffers and refuses half-given ranks", "[cpu][comm][mpi]") {
  Communicator* c = mpi_comm();
  if (!c) PLX_SKIP("the mpi plugin was not built (no MPI found at configure time)");
  CHECK(c->backends() == std::vector<std::string>{"cpu"});
  CHECK(c->plugin().name() == "mpi");
  CHECK(c->table().bench_native != nullptr);  // plexus bench comm's native baseline
  CHECK_THROWS_WITH(c->join(cpu(), 0, 0, -1, plx_comm_id{}),
                    PLX_CONTAINS("rank and size are both -1 (from the launcher) or both given"));
  CHECK_THROWS_WITH(c->join(cpu(), 0, -1, -1, plx_comm_id{}, -5),
                    PLX_CONTAINS("timeout_ms must be >= 0, got -5"));
}
