// The tests' main: GoogleTest's, plus one line naming the LibTorch the binary runs against, also
// recorded as the property "libtorch" of the run in the XML result.
#include <cstdio>

#include <gmock/gmock.h>

#include "tools/libtorch_info.h"

int main(int argc, char** argv) {
  ::testing::InitGoogleMock(&argc, argv);
  const std::string libtorch = warden::tools::LibTorchDescription();
  std::printf("LibTorch %s\n", libtorch.c_str());
  ::testing::Test::RecordProperty("libtorch", libtorch);
  return RUN_ALL_TESTS();
}
