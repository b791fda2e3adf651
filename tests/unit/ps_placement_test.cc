// Key placement: MXNet's rule and the balanced chunked rule.
#include <gtest/gtest.h>

#include <map>

#include "net/message.h"
#include "worker/placement.h"

namespace pstrain {
namespace {

uint64_t Covered(const std::vector<PartPlan>& parts) {
  uint64_t next = 0;
  for (const PartPlan& p : parts) {
    EXPECT_EQ(p.offset, next);
    EXPECT_GT(p.len, 0u);
    next += p.len;
  }
  return next;
}

TEST(PlacementTest, MxnetSmallArrayGoesWholeToHashedServer) {
  PlacementOptions o;
  o.policy = Placement::kMxnet;
  o.num_servers = 4;
  for (uint64_t key = 0; key < 50; ++key) {
    auto parts = PlaceKey(key, 1000, o);
    ASSERT_TRUE(parts.ok());
    ASSERT_EQ(parts->size(), 1u);
    EXPECT_EQ((*parts)[0].server, static_cast<int>((key * 9973) % 4));
    EXPECT_EQ((*parts)[0].len, 1000u);
  }
}

TEST(PlacementTest, MxnetBigArraySplitsEvenlyOverAllServers) {
  PlacementOptions o;
  o.policy = Placement::kMxnet;
  o.num_servers = 3;
  // 1,000,000 elements is the bound itself: split; boundaries round(n/S*i).
  auto parts = PlaceKey(7, 1000000, o);
  ASSERT_TRUE(parts.ok());
  ASSERT_EQ(parts->size(), 3u);
  EXPECT_EQ(Covered(*parts), 1000000u);
  EXPECT_EQ((*parts)[0].len, 333333u);
  EXPECT_EQ((*parts)[1].offset, 333333u);
  EXPECT_EQ((*parts)[1].len, 333334u);  // round(666666.67) - 333333
  EXPECT_EQ((*parts)[2].len, 333333u);
  for (int i = 0; i < 3; ++i) EXPECT_EQ((*parts)[i].server, i);
  // One below the bound stays whole.
  auto whole = PlaceKey(7, 999999, o);
  ASSERT_TRUE(whole.ok());
  EXPECT_EQ(whole->size(), 1u);
}

TEST(PlacementTest, BalancedCutsBigArraysIntoNearEqualChunksOverServers) {
  PlacementOptions o;
  o.policy = Placement::kBalanced;
  o.num_servers = 2;
  o.chunk_elems = 1000;
  auto parts = PlaceKey(3, 4500, o);
  ASSERT_TRUE(parts.ok());
  ASSERT_EQ(parts->size(), 5u);
  EXPECT_EQ(Covered(*parts), 4500u);
  std::map<int, uint64_t> per_server;
  for (const PartPlan& p : *parts) {
    EXPECT_EQ(p.len, 900u);
    per_server[p.server] += p.len;
  }
  EXPECT_EQ(per_server.size(), 2u);
  auto small = PlaceKey(3, 1000, o);
  ASSERT_TRUE(small.ok());
  EXPECT_EQ(small->size(), 1u);
  EXPECT_EQ((*small)[0].server, static_cast<int>((3 * 9973) % 2));
}

TEST(PlacementTest, RejectsBadKeysAndLengths) {
  PlacementOptions o;
  EXPECT_FALSE(PlaceKey(kMaxUserKey + 1, 10, o).ok());
  EXPECT_FALSE(PlaceKey(1, 0, o).ok());
  o.policy = Placement::kBalanced;
  o.chunk_elems = 1;
  auto too_many = PlaceKey(1, uint64_t{kMaxParts} + 1, o);
  EXPECT_FALSE(too_many.ok());
  EXPECT_NE(too_many.status().message().find("chunks"), std::string::npos);
}

TEST(PlacementTest, WireKeyRoundTrips) {
  const uint64_t w = WireKey(5, 123456789, 77);
  EXPECT_EQ(WireKeyServer(w), 5);
  EXPECT_EQ(WireKeyUser(w), 123456789u);
  EXPECT_EQ(WireKeyPart(w), 77);
  EXPECT_EQ(ServerId(3), 14);
  EXPECT_EQ(WorkerId(3), 15);
  EXPECT_EQ(RankOfId(15), 3);
  EXPECT_TRUE(IsServerId(8));
  EXPECT_TRUE(IsWorkerId(9));
}

TEST(PlacementTest, ParsePlacementNames) {
  EXPECT_EQ(*ParsePlacement("mxnet"), Placement::kMxnet);
  EXPECT_EQ(*ParsePlacement("balanced"), Placement::kBalanced);
  EXPECT_FALSE(ParsePlacement("random").ok());
}

}  // namespace
}  // namespace pstrain
