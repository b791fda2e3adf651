// An annotated mutex, its scoped lock and a condition variable whose waits
// always have a deadline. libstdc++'s std::mutex carries no thread-safety
// annotations, so clang's -Wthread-safety can check only code that uses these.
#ifndef PSTRAIN_COMMON_MUTEX_H_
#define PSTRAIN_COMMON_MUTEX_H_

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "common/deadline.h"
#include "common/thread_annotations.h"

namespace pstrain {

class CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() ACQUIRE() { mu_.lock(); }
  void Unlock() RELEASE() { mu_.unlock(); }
  void AssertHeld() ASSERT_CAPABILITY(this) {}

 private:
  friend class CondVar;
  std::mutex mu_;
};

// Holds `mu` for the lifetime of the object.
class SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ACQUIRE(mu) : mu_(mu) { mu_->Lock(); }
  ~MutexLock() RELEASE() { mu_->Unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex* const mu_;
};

// A condition variable tied to one Mutex. There is no wait without a deadline.
class CondVar {
 public:
  explicit CondVar(Mutex* mu) : mu_(mu) {}
  CondVar(const CondVar&) = delete;
  CondVar& operator=(const CondVar&) = delete;

  // Waits until `pred()` holds or `deadline` passes; returns pred()'s last value.
  // REQUIRES: the Mutex given to the constructor is held by the caller. (Not
  // annotated: clang cannot tie this object's mu_ to the caller's mutex
  // expression, so an annotation would warn at every call.)
  template <typename Pred>
  bool WaitUntil(Deadline deadline, Pred pred) NO_THREAD_SAFETY_ANALYSIS {
    std::unique_lock<std::mutex> lock(mu_->mu_, std::adopt_lock);
    bool result = cv_.wait_until(lock, deadline.time_point(), pred);
    lock.release();  // the caller's MutexLock still owns the mutex
    return result;
  }

  void Signal() { cv_.notify_one(); }
  void SignalAll() { cv_.notify_all(); }

 private:
  Mutex* const mu_;
  std::condition_variable cv_;
};

}  // namespace pstrain

#endif  // PSTRAIN_COMMON_MUTEX_H_
