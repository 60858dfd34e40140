// The CI failure of comm_mpi_np8 ("Tracer caught signal 11" from LeakSanitizer at exit), made
// deterministic: threads hold dynamic TLS blocks of a dlopen'ed library (as OpenMPI's plugins
// do) when the exit-time leak check runs. GCC <= 13's sanitizer runtime takes a malloc'ed TLS
// block that starts 16 bytes past a page boundary for a glibc 2.19 block with a header, reads
// the words before it as a range, and LeakSanitizer's tracer segfaults scanning it. Run under
// the ASan options of our CTest runs this exits 0; with intercept_tls_get_addr=1 (the default)
// it dies in the tracer, which is what this test guards against. Argument: the library path.
#include <dlfcn.h>
#include <pthread.h>

#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

namespace {

using SlotFn = long* (*)();
SlotFn slot_fn = nullptr;
pthread_barrier_t started, never;

void* body(void*) {
  slot_fn()[0] = 1;  // allocates this thread's block
  pthread_barrier_wait(&started);
  pthread_barrier_wait(&never);  // still alive when exit() runs the leak check
  return nullptr;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return std::fprintf(stderr, "usage: %s LIBRARY\n", argv[0]), 2;
  void* lib = dlopen(argv[1], RTLD_NOW);
  if (lib == nullptr) return std::fprintf(stderr, "dlopen: %s\n", dlerror()), 2;
  slot_fn = reinterpret_cast<SlotFn>(dlsym(lib, "magi_dynamic_tls_slot"));
  if (slot_fn == nullptr) return std::fprintf(stderr, "dlsym: %s\n", dlerror()), 2;
  constexpr unsigned kThreads = 64;  // each reproduced the crash alone (50 and 300 too)
  pthread_barrier_init(&started, nullptr, kThreads + 1);
  pthread_barrier_init(&never, nullptr, kThreads + 1);
  std::vector<pthread_t> threads(kThreads);
  for (pthread_t& t : threads) pthread_create(&t, nullptr, body, nullptr);
  pthread_barrier_wait(&started);
  std::printf("%u threads hold dynamic TLS blocks; exiting with them alive\n", kThreads);
  std::fflush(stdout);
  std::exit(0);
}
