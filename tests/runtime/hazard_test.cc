// Note [Reclaiming snapshots] (runtime/hazard.h): what a reader holds is reported to the
// publisher's scan, nested readers use their own slots, and a thread past its slots blocks
// reclamation instead of going unprotected.
#include "runtime/hazard.h"

#include <algorithm>
#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace warden::runtime::hazard {
namespace {

bool Held(const std::vector<const void*>& held, const void* p) {
  return std::find(held.begin(), held.end(), p) != held.end();
}

TEST(Hazard, ReadersAreSeenByTheScanUntilTheyFinish) {
  int a = 1, b = 2;
  std::atomic<const int*> source{&a};
  std::atomic<int> overflow{0};
  std::vector<const void*> held;
  {
    Reader<int> reader(source, overflow);
    EXPECT_EQ(reader.get(), &a);
    source.store(&b);
    ASSERT_TRUE(Scan(overflow, &held)) << "membarrier is unavailable: nothing is reclaimed here";
    EXPECT_TRUE(Held(held, &a));
    {
      Reader<int> nested(source, overflow);
      EXPECT_EQ(nested.get(), &b);
      ASSERT_TRUE(Scan(overflow, &held));
      EXPECT_TRUE(Held(held, &a));
      EXPECT_TRUE(Held(held, &b));
    }
  }
  ASSERT_TRUE(Scan(overflow, &held));
  EXPECT_FALSE(Held(held, &a));
  EXPECT_FALSE(Held(held, &b));
}

TEST(Hazard, AReaderOnAnotherThreadIsSeen) {
  int a = 1;
  std::atomic<const int*> source{&a};
  std::atomic<int> overflow{0};
  std::atomic<bool> reading{false}, done{false};
  std::thread t([&] {
    Reader<int> reader(source, overflow);
    reading = true;
    while (!done) std::this_thread::yield();
  });
  while (!reading) std::this_thread::yield();
  std::vector<const void*> held;
  ASSERT_TRUE(Scan(overflow, &held));
  EXPECT_TRUE(Held(held, &a));
  done = true;
  t.join();
  ASSERT_TRUE(Scan(overflow, &held));
  EXPECT_FALSE(Held(held, &a));
}

TEST(Hazard, ReadersPastTheSlotsBlockReclamation) {
  int a = 1;
  std::atomic<const int*> source{&a};
  std::atomic<int> overflow{0};
  std::vector<std::unique_ptr<Reader<int>>> nested;
  for (int i = 0; i < kSlots + 2; ++i) nested.push_back(std::make_unique<Reader<int>>(source, overflow));
  for (const auto& r : nested) EXPECT_EQ(r->get(), &a);
  EXPECT_EQ(overflow.load(), 2);
  std::vector<const void*> held;
  EXPECT_FALSE(Scan(overflow, &held)) << "a reader without a slot must stop reclamation";
  while (!nested.empty()) nested.pop_back();  // innermost first
  EXPECT_EQ(overflow.load(), 0);
  ASSERT_TRUE(Scan(overflow, &held));
  EXPECT_FALSE(Held(held, &a));
}

}  // namespace
}  // namespace warden::runtime::hazard
