// What this binary is: "<version>+<git describe>" of the tree it was built
// from ("0.1.0+cd81f90a1b2c-dirty"; "+nogit" outside a git checkout). Every
// node of a job must run the same build: the scheduler compares them at
// registration.
#ifndef PSTRAIN_COMMON_BUILD_INFO_H_
#define PSTRAIN_COMMON_BUILD_INFO_H_

namespace pstrain {

const char* BuildId();

}  // namespace pstrain

#endif  // PSTRAIN_COMMON_BUILD_INFO_H_
