// The training config (protobuf text format) and the flag overrides: every
// input is parsed or refused with a Status naming the place.
#include <cstdint>
#include <string>

#include "worker/train_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace pstrain;
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto cfg = ParseTrainConfigText(text, "fuzz.cfg");
  if (!cfg.ok()) return 0;
  (void)ValidateTrainConfig(*cfg);
  (void)ParseTrainingDevices(*cfg);
  (void)EffectiveConfigText(*cfg);
  const size_t eq = text.find('=');
  if (eq != std::string::npos) {
    TrainConfig c = *cfg;
    (void)ApplyConfigOverrides({{text.substr(0, eq), text.substr(eq + 1)}}, &c);
  }
  return 0;
}
