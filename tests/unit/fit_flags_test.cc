// fit.py flags: defaults equal the config schema's, and flags given on the
// command line override the --config file.
#include "tools/fit_flags.h"

#include <gflags/gflags.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tests/test_util.h"
#include "worker/train_config.h"

DECLARE_string(config);

namespace pstrain {
namespace {

std::string FieldLine(const std::string& text, const std::string& name) {
  size_t at = text.find("\n" + name + ": ");
  if (text.compare(0, name.size() + 2, name + ": ") == 0)
    at = 0;
  else if (at != std::string::npos)
    ++at;
  if (at == std::string::npos) return "";
  std::string line = text.substr(at, text.find('\n', at) - at);
  size_t mark = line.find("  # default");
  return mark == std::string::npos ? line : line.substr(0, mark);
}

TEST(FitFlagsTest, EveryFlagIsAFieldWithTheSameDefault) {
  std::vector<gflags::CommandLineFlagInfo> flags;
  gflags::GetAllFlags(&flags);
  const std::string defaults = EffectiveConfigText(TrainConfig());
  int checked = 0;
  for (const auto& f : flags) {
    if (f.filename.find("fit_flags.cc") == std::string::npos || f.name == "config") continue;
    TrainConfig cfg;
    ASSERT_OK(ApplyConfigOverrides({{f.name, f.default_value}}, &cfg));
    EXPECT_EQ(FieldLine(EffectiveConfigText(cfg), f.name), FieldLine(defaults, f.name))
        << "--" << f.name << " default " << f.default_value;
    ++checked;
  }
  // All but version, data_train and data_val (those two flags are the image
  // pipeline's, tools/image_flags.cc).
  EXPECT_EQ(checked, TrainConfig::descriptor()->field_count() - 3);
}

TEST(FitFlagsTest, GivenFlagsOverrideTheConfigFile) {
  gflags::FlagSaver saver;
  auto path = std::filesystem::temp_directory_path() /
              ("pstrain_fit_flags_" + std::to_string(::getpid()) + ".cfg");
  {
    std::ofstream out(path);
    out << "network: \"mlp\"\ndata_dir: \"/tmp/mnist\"\nnum_epochs: 3\nlr: 0.05\nbatch_size: 64\n";
  }
  FLAGS_config = path.string();
  gflags::SetCommandLineOption("num_epochs", "7");
  gflags::SetCommandLineOption("network", "lenet");
  auto cfg = TrainConfigFromFlags();
  std::filesystem::remove(path);
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  EXPECT_EQ(cfg->num_epochs(), 7);
  EXPECT_EQ(cfg->network(), "lenet");
  EXPECT_FLOAT_EQ(cfg->lr(), 0.05f);
  EXPECT_EQ(cfg->batch_size(), 64);
  EXPECT_EQ(cfg->data_dir(), "/tmp/mnist");
  EXPECT_FLOAT_EQ(cfg->mom(), 0.9f);  // neither: fit.py's default
}

TEST(FitFlagsTest, BadValuesAreClearErrors) {
  gflags::FlagSaver saver;
  gflags::SetCommandLineOption("network", "lenet");
  gflags::SetCommandLineOption("data_dir", "/tmp/mnist");
  gflags::SetCommandLineOption("batch_size", "0");
  auto cfg = TrainConfigFromFlags();
  ASSERT_FALSE(cfg.ok());
  EXPECT_NE(cfg.status().message().find("--batch-size=0"), std::string::npos) << cfg.status();
  gflags::SetCommandLineOption("batch_size", "128");
  FLAGS_config = "/nonexistent/job.cfg";
  cfg = TrainConfigFromFlags();
  ASSERT_FALSE(cfg.ok());
  EXPECT_NE(cfg.status().message().find("/nonexistent/job.cfg"), std::string::npos);
}

}  // namespace
}  // namespace pstrain
