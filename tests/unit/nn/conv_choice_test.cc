// The rule that picks a convolution algorithm from timed candidates
// (nn/cuda/conv_choice.h): cuDNN's legacy search and the race of its graph
// engines both use it, so it is checked here, on machines without a GPU.
#include "nn/cuda/conv_choice.h"

#include <gtest/gtest.h>

#include <vector>

namespace pstrain::internal::cuda {
namespace {

TEST(ConvChoiceTest, NothingTimedChoosesNothing) { EXPECT_EQ(ChooseTimed({}), -1); }

TEST(ConvChoiceTest, TheFastestWinsWhenNoneNearItNeedsLessWorkspace) {
  EXPECT_EQ(ChooseTimed({{2.0f, 0}, {1.0f, 100}, {1.5f, 0}}), 1);
  // Within the slack but needing more: the fastest still.
  EXPECT_EQ(ChooseTimed({{1.0f, 100}, {1.02f, 200}}), 0);
}

TEST(ConvChoiceTest, ALittleSlowerWithLessWorkspaceWins) {
  // The race's case: the legacy choice (index 0) with no workspace, a graph
  // plan 0.5% faster asking for 300 MB. The legacy algorithm runs.
  EXPECT_EQ(ChooseTimed({{1.0f, 0}, {0.995f, size_t{300} << 20}}), 0);
  // Of several inside 3%, the least workspace; outside it, never.
  EXPECT_EQ(ChooseTimed({{1.0f, 400}, {1.02f, 100}, {1.029f, 50}, {1.2f, 0}}), 2);
  // A plan more than 3% faster takes its workspace.
  EXPECT_EQ(ChooseTimed({{1.0f, 0}, {0.95f, size_t{300} << 20}}), 1);
}

TEST(ConvChoiceTest, EqualWorkspaceGoesToTheFasterAndTiesToTheFirst) {
  EXPECT_EQ(ChooseTimed({{1.01f, 64}, {1.0f, 64}, {1.02f, 64}}), 1);
  EXPECT_EQ(ChooseTimed({{1.0f, 64}, {1.0f, 64}}), 0);
}

TEST(ConvChoiceTest, TheSlackIsAParameter) {
  const std::vector<TimedAlgorithm> timed = {{1.0f, 100}, {1.08f, 0}};
  EXPECT_EQ(ChooseTimed(timed), 0);
  EXPECT_EQ(ChooseTimed(timed, 1.10f), 1);
}

}  // namespace
}  // namespace pstrain::internal::cuda
