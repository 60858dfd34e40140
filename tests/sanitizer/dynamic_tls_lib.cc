// A shared library with a thread_local, loaded with dlopen by dynamic_tls_test.cc: every thread
// that touches it gets a dynamic TLS block that glibc allocates with malloc.
extern "C" long* magi_dynamic_tls_slot() {
  static thread_local long slot[2];
  return slot;
}
