// The tests' main: GoogleTest's, plus one line naming the LibTorch the binary runs against, also
// recorded as the property "libtorch" of the run in the XML result.
#include <cstdio>
#include <cstdlib>

#include <gmock/gmock.h>

#include "tools/libtorch_info.h"

int main(int argc, char** argv) {
  ::testing::InitGoogleMock(&argc, argv);
  // Note [Dynamism profiles]: a profile written by one test (or by an earlier run of the suite, in
  // the same home directory) would change another's compile counts. Off unless a test turns it on.
  setenv("WARDEN_DYNAMISM_PROFILES", "0", /*overwrite=*/0);
  const std::string libtorch = warden::tools::LibTorchDescription();
  std::printf("LibTorch %s\n", libtorch.c_str());
  ::testing::Test::RecordProperty("libtorch", libtorch);
  return RUN_ALL_TESTS();
}
