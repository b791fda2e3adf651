// A stand-in for libpstrain_cuda.so from another build, as an ABI-6 module
// was: PstrainCudaModuleAbi takes no room and writes a struct of its own
// size, here one far larger than this build's, with an older version first.
// The binary must refuse it by name, not let it overwrite its stack.
#include <cstring>

#define FAKE_EXPORT extern "C" __attribute__((visibility("default")))

FAKE_EXPORT void PstrainCudaModuleAbi(void* abi) {
  unsigned char big[1024];
  std::memset(big, 0x5a, sizeof(big));
  const int version = 5;
  std::memcpy(big, &version, sizeof(version));
  std::memcpy(abi, big, sizeof(big));
}
// The other entry points exist, so that the ABI alone decides; none is called.
FAKE_EXPORT void PstrainCreateCudaBackend(const void*, void*) {}
FAKE_EXPORT int PstrainCudaDeviceCount(void*) { return 0; }
FAKE_EXPORT void PstrainMakeCudaOperator(const void*, void*) {}
