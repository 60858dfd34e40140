// The NCCL loader (src/comm/nccl/nccl_api.cc) without a GPU: with MAGI_NCCL_LIBRARY naming a
// file that does not exist (CTest case nccl_loader_missing sets it), nothing else is tried and
// every entry point says so, naming the file; without it (case nccl_loader), available() and
// library_version() agree with each other.
#include <gtest/gtest.h>

#include <cstdlib>
#include <functional>
#include <string>

#include "magi/error.h"
#include "magi/nccl.h"

namespace magi::comm::nccl {
namespace {

constexpr char kMissing[] = "/nonexistent/libnccl.so.2";

bool env_names_missing() {
  const char* env = std::getenv("MAGI_NCCL_LIBRARY");
  return env && std::string(env) == kMissing;
}

void expect_error_naming(const std::function<void()>& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no magi::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(NcclLoaderMissing, EveryEntryPointNamesTheFile) {
  if (!env_names_missing()) GTEST_SKIP() << "run with MAGI_NCCL_LIBRARY=" << kMissing;
  std::string why;
  EXPECT_FALSE(available(&why));
  EXPECT_NE(why.find(kMissing), std::string::npos) << why;
  EXPECT_NE(why.find("MAGI_NCCL_LIBRARY"), std::string::npos) << why;
  expect_error_naming([] { library_version(); }, kMissing);
  expect_error_naming([] { make_unique_id(); }, kMissing);
  expect_error_naming([] { make_communicator(UniqueId{}, 0, 1, 0); }, kMissing);
}

TEST(NcclLoader, BadArgumentsAreNamedBeforeLoading) {
  expect_error_naming([] { make_communicator(UniqueId{}, 2, 2, 0); }, "rank 2 outside [0, 2)");
  expect_error_naming([] { make_communicator(UniqueId{}, 0, 0, 0); }, "world size 0");
}

TEST(NcclLoader, AvailableAndVersionAgree) {
  if (env_names_missing()) GTEST_SKIP() << "MAGI_NCCL_LIBRARY names a missing file";
  std::string why;
  if (available(&why)) {
    const std::string v = library_version();
    EXPECT_EQ(v.rfind("2.", 0), 0u) << v;
    std::printf("libnccl %s\n", v.c_str());
  } else {
    EXPECT_FALSE(why.empty());
    EXPECT_THROW(library_version(), Error);
    std::printf("no libnccl here: %s\n", why.c_str());
  }
}

}  // namespace
}  // namespace magi::comm::nccl
