// magiattn._dist module: MPI session, communicators and plans. MPI is initialised on first use
// unless someone (mpi4py, the caller's C code) already did; we finalise only what we
// initialised. A communicator comes from MPI_COMM_WORLD or from a Fortran handle (mpi4py's
// comm.py2f()), so mpi4py is never a build dependency. The key's plan is made here (make_plan,
// from the mask's ranges) and stays a C++ value; a saved plan arrives as its JSON text
// (Plan.from_json). The two modules share no C++ types.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

// <iostream>: see module.cc (the stream initialiser that a static libstdc++ needs).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <iostream>
#include <optional>
#include <set>
#include <string>

#include "arrays.h"
#include "dist.h"
#include "magi/error.h"
#include "magi/plan.h"
#include "mask_args.h"
#include "mpi_check.h"
#include "plan_options.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace magi::py::dist {
namespace {

bool g_initialised_here = false;
std::set<Comm*>& live_comms() {
  static auto* s = new std::set<Comm*>;  // never destroyed: outlives every Comm
  return *s;
}

// True when this call initialised MPI (the caller then owns finalising it).
bool init_mpi() {
  int initialised = 0, finalised = 0;
  MPI_Initialized(&initialised);
  MPI_Finalized(&finalised);
  MAGI_CHECK(!finalised, "MPI is already finalized in this process; start a new one");
  if (initialised) return false;
  int provided = 0;  // MULTIPLE, as mpi4py asks: the communicator's progress thread needs it
  MAGI_MPI_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided));
  g_initialised_here = true;
  return true;
}

void shutdown(bool finalize) {
  Comm::close_all();
  int finalised = 0;
  MPI_Finalized(&finalised);
  if (finalize && g_initialised_here && !finalised) MPI_Finalize();
}

MPI_Comm from_handle(std::optional<long long> fortran_handle) {
  if (!fortran_handle) return MPI_COMM_WORLD;
  const MPI_Comm c = MPI_Comm_f2c(MPI_Fint(*fortran_handle));
  MAGI_CHECK(c != MPI_COMM_NULL, "cp group: Fortran handle ", *fortran_handle,
             " is MPI_COMM_NULL (is this rank in the group?)");
  return c;
}

}  // namespace

Comm::Comm(MPI_Comm comm) : c_(std::make_unique<comm::mpi::MpiCommunicator>(comm)) {
  live_comms().insert(this);
}
Comm::~Comm() { live_comms().erase(this); }

comm::mpi::MpiCommunicator& Comm::get(const char* op) {
  MAGI_CHECK(c_ != nullptr, op, ": the communicator is closed (MPI was shut down at exit)");
  return *c_;
}

void Comm::close() { c_.reset(); }

void Comm::close_all() {
  for (Comm* c : live_comms()) c->close();
}

}  // namespace magi::py::dist

NB_MODULE(_dist, m) {
  using magi::py::dist::Comm;
  namespace mpi = magi::comm::mpi;
  m.doc() = "magiattn distributed runtime over MPI (CPU ranks)";
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const magi::Error& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const magi::py::dist::CommFailure& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what());
    }
  });
  m.def("init_mpi", &magi::py::dist::init_mpi,
        "Initialise MPI (THREAD_MULTIPLE) unless it already is; True if this call did");
  m.def("shutdown", &magi::py::dist::shutdown, "finalize"_a = true,
        "Close every communicator, then MPI_Finalize if asked and init_mpi initialised MPI");

  nb::class_<Comm>(m, "Communicator")
      .def(
          "__init__",
          [](Comm* self, std::optional<long long> handle) {
            new (self) Comm(magi::py::dist::from_handle(handle));
          },
          "fortran_handle"_a.none() = nb::none(),
          "Duplicates MPI_COMM_WORLD (None) or the communicator of a Fortran handle")
      .def_prop_ro("rank", [](Comm& c) { return c.get("rank").rank(); })
      .def_prop_ro("size", [](Comm& c) { return c.get("size").size(); })
      .def_prop_ro("broken", [](Comm& c) { return c.get("broken").broken(); })
      .def_prop_ro("closed", &Comm::closed)
      .def_prop_rw(
          "timeout", [](Comm& c) { return double(c.get("timeout").timeout().count()) / 1000.0; },
          [](Comm& c, double seconds) {
            MAGI_CHECK(std::isfinite(seconds) && seconds > 0, "timeout: ", seconds,
                       " s must be finite and > 0");
            c.get("timeout").set_timeout(
                std::chrono::milliseconds(std::max<long long>(1, std::llround(seconds * 1e3))));
          },
          "Seconds any wait may block before it raises RuntimeError naming the missing ranks")
      .def("close", &Comm::close);

  nb::class_<magi::plan::DistPlan>(m, "Plan")
      .def_static(
          "from_json", [](const std::string& text) { return magi::plan::plan_from_json(text); },
          "text"_a)
      .def(
          "to_json", [](const magi::plan::DistPlan& p) { return p.to_json(); },
          "The planner's JSON text of the plan")
      .def_prop_ro("cp", [](const magi::plan::DistPlan& p) { return int(p.ranks.size()); })
      .def_prop_ro("total_seqlen",
                   [](const magi::plan::DistPlan& p) { return p.dispatch.total_seqlen; })
      .def(
          "rank_tokens",
          [](const magi::plan::DistPlan& p, int rank) {
            MAGI_CHECK(rank >= 0 && rank < int(p.ranks.size()), "rank ", rank,
                       " is not in a plan for cp ", p.ranks.size());
            return p.dispatch.rank_tokens(rank);
          },
          "rank"_a)
      .def(
          "position_ids",
          [](const magi::plan::DistPlan& p, int rank) {
            MAGI_CHECK(rank >= 0 && rank < int(p.ranks.size()), "rank ", rank,
                       " is not in a plan for cp ", p.ranks.size());
            std::vector<std::int64_t> ids = p.dispatch.position_ids(rank);
            const std::size_t n = ids.size();
            return magi::py::to_numpy(std::move(ids), {n});
          },
          "rank"_a, "Global token index of every local row of `rank` (int64 [local tokens])");
  // The key's plan made here, a C++ value from the mask's ranges to the runtime (no JSON text
  // between the modules; plan_options.h is the one reading of the options).
  m.def(
      "make_plan",
      [](std::int64_t total_seqlen_q, std::int64_t total_seqlen_k, nb::handle q_ranges,
         nb::handle k_ranges, nb::handle attn_type_map, int cp, int num_stages,
         std::int64_t chunk_size, const std::string& algorithm, bool uneven) {
        const magi::Mask mask = magi::py::make_mask(total_seqlen_q, total_seqlen_k, q_ranges, k_ranges,
                                              attn_type_map);
        const magi::plan::PlanOptions opts =
            magi::py::plan_options(cp, num_stages, chunk_size, algorithm, uneven);
        nb::gil_scoped_release release;
        return magi::plan::make_plan(mask, opts);
      },
      "total_seqlen_q"_a, "total_seqlen_k"_a, "q_ranges"_a, "k_ranges"_a, "attn_type_map"_a,
      "cp"_a, "num_stages"_a, "chunk_size"_a, "algorithm"_a, "uneven"_a,
      "The plan of the mask (its ranges and types, as Mask takes them) over `cp` ranks");
  magi::py::dist::bind_runtime(m);
}
