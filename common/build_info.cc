#include "common/build_info.h"

#include "pstrain_build_info.h"  // generated (common/CMakeLists.txt)

namespace pstrain {

const char* BuildId() { return PSTRAIN_BUILD_ID; }

}  // namespace pstrain
